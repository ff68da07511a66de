// caracal_gather_bench: how fast a CTA's producer warpgroup fills the GEMMs' stage ring with rows
// gathered by cp.async (gathered_rows.cuh, as the fused forward's up/gate tiles and the W = 1 FP8
// up/gate read x in place; their sources looked up once a tile, or again every stage as a gather
// along K must) against one thread's TMA loads of contiguous rows (the row buffers a copy filled
// first), with no tensor-core work: the ceiling of each operand path, to set beside a GEMM's bytes
// per k step (a bf16 128 x 256 x 64 tile takes 16 KiB of A and 32 KiB of B per 4.2 MFLOP).
//
// A persistent CTA an SM; its producer warpgroup streams 128-row tiles of a [T][D] bf16 matrix, each
// tile's k steps through a ring of 4 stages of `boxes` 128 x 64 boxes (16 KiB each), and one consumer
// warpgroup waits for each stage, reads one 16-byte word a thread from every box and releases it.
// Gathered tiles read rows in a random permutation of the tokens (a route's row, the fused forward's
// case), TMA tiles consecutive rows. Printed: TB/s into shared memory (all SMs) and GB/s an SM, the
// median of --reps timed launches; the words the consumers read are summed, and with the identity
// order (--check) both paths must sum the same (exit status 1 if not, or on any CUDA error).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <cutlass/arch/barrier.h>

#include "device/gemm/gathered_rows.cuh"
#include "device/gemm/gemm_config.cuh"
#include "device/gemm/gemm_policy.cuh"
#include "device/gemm/tma_pipeline.cuh"
#include "gemm/tensor_map.hpp"

namespace {

using caracal::gemm::kBlockM;
using Tile = caracal::gemm::Bf16GemmPolicy::A;  // 128 rows x 64 bf16: one 16 KiB box
constexpr int kStages = 4;
constexpr int kMaxBoxes = 2;
constexpr int kThreadsPerCta = 256;  // the producer warpgroup and one consumer warpgroup

struct Smem {
  alignas(1024) Tile::Element box[kStages][kMaxBoxes][kBlockM * 64];
  alignas(8) uint64_t full[kStages];
  alignas(8) uint64_t empty[kStages];
};

struct Args {
  const __nv_bfloat16* matrix;  // [tokens][hidden]
  const int* token_of_row;      // [rows]: the token each schedule row reads (gathered)
  int rows, hidden, boxes, tiles_per_cta;
  unsigned long long* checksum;
};

__device__ inline void arrive_consumers_done(uint64_t* empty, int lane) {
  __syncwarp();
  if (lane == 0) cutlass::arch::ClusterBarrier::arrive(empty);
}

// How the producer fills a stage: thread 0's TMA loads of the tile's consecutive rows; every
// producer thread's cp.async copies (gather_k_tile) of rows whose sources it looked up once per tile
// (the fused forward's up/gate A, K along the row); or looked up again for every stage (a gather
// along K, as the weight gradients' rows: each stage's rows are new, their routes loaded first).
enum class Fill { kTma, kGatherPerTile, kGatherPerStage };

template <Fill kFill>
__global__ void __launch_bounds__(kThreadsPerCta, 1) stream_rows(const __grid_constant__ CUtensorMap map, Args a) {
  constexpr bool kGather = kFill != Fill::kTma;
  extern __shared__ uint8_t raw[];
  Smem& s = *reinterpret_cast<Smem*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023));
  int const thread = int(threadIdx.x);
  if (thread == 0) {
    for (int st = 0; st < kStages; ++st) {
      // Gathered: thread 0's arrival and one per producer thread and box (gather_k_tile's).
      uint32_t const arrivals = kGather ? 1u + caracal::gemm::kGatherArrivals * uint32_t(a.boxes) : 1u;
      cutlass::arch::ClusterTransactionBarrier::init(&s.full[st], arrivals);
      cutlass::arch::ClusterBarrier::init(&s.empty[st], 4);  // the consumer warpgroup's warps
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();
  int const k_steps = a.hidden / (64 * a.boxes);
  uint32_t const stage_bytes = uint32_t(a.boxes) * uint32_t(Tile::kBytes);
  int const tiles = a.rows / kBlockM;
  if (thread < 128) {  // producer
    int stage = 0;
    uint32_t phase = 0;
    for (int i = 0; i < a.tiles_per_cta; ++i) {
      int const tile = (int(blockIdx.x) + i * int(gridDim.x)) % tiles;
      caracal::gemm::GatherRows rows{};
      auto look_up = [&](int block) {  // the sources of row block `block`'s rows
        for (int j = 0; j < caracal::gemm::kGatherRowsPerThread; ++j) {
          int const token = __ldg(&a.token_of_row[block * kBlockM + caracal::gemm::gather_row(thread, j)]);
          rows.src[j] = a.matrix + int64_t(token) * a.hidden;
        }
      };
      if (kFill == Fill::kGatherPerTile) look_up(tile);
      for (int k = 0; k < k_steps; ++k) {
        cutlass::arch::ClusterBarrier::wait(&s.empty[stage], phase ^ 1u);
        if (kFill == Fill::kGatherPerStage) look_up((tile + k) % tiles);
        if (kGather) {
          if (thread == 0) cutlass::arch::ClusterBarrier::arrive(&s.full[stage]);
          for (int b = 0; b < a.boxes; ++b) {
            caracal::gemm::gather_k_tile<Tile>(rows, a.matrix, (k * a.boxes + b) * 64, s.box[stage][b], &s.full[stage],
                                               thread);
          }
        } else if (thread == 0) {
          cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&s.full[stage], stage_bytes);
          for (int b = 0; b < a.boxes; ++b) {
            cute::SM90_TMA_LOAD_2D::copy(&map, &s.full[stage], uint64_t(cute::TMA::CacheHintSm90::EVICT_NORMAL),
                                         s.box[stage][b], (k * a.boxes + b) * 64, tile * kBlockM);
          }
        }
        if (++stage == kStages) {
          stage = 0;
          phase ^= 1u;
        }
      }
    }
  } else {  // consumer: one word a thread of each box, then the stage back
    int const t = thread - 128, lane = t % 32;
    unsigned long long sum = 0;
    int stage = 0;
    uint32_t phase = 0;
    for (int i = 0; i < a.tiles_per_cta * k_steps; ++i) {
      cutlass::arch::ClusterTransactionBarrier::wait(&s.full[stage], phase);
      if (kGather) cutlass::arch::fence_view_async_shared();
      for (int b = 0; b < a.boxes; ++b) {
        uint4 const w = reinterpret_cast<const uint4*>(s.box[stage][b])[t * 8 + i % 8];
        sum += uint64_t(w.x) + w.y + w.z + w.w;
      }
      arrive_consumers_done(&s.empty[stage], lane);
      if (++stage == kStages) {
        stage = 0;
        phase ^= 1u;
      }
    }
    atomicAdd(a.checksum, sum);
  }
}

}  // namespace

namespace {

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    std::fprintf(stderr, "caracal_gather_bench: %s: %s\n", what, cudaGetErrorString(err));
    std::exit(1);
  }
}

struct Result {
  double ms;
  unsigned long long checksum;
};

// The median of `reps` launches (after one warm-up) of one path over `a`.
template <Fill kFill>
Result time_path(const CUtensorMap& map, Args a, int ctas, int reps) {
  int const smem = int(sizeof(Smem)) + 1024;
  check(cudaFuncSetAttribute(stream_rows<kFill>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), "smem limit");
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "event");
  check(cudaEventCreate(&stop), "event");
  std::vector<float> ms;
  Result r{};
  for (int rep = 0; rep <= reps; ++rep) {
    check(cudaMemset(a.checksum, 0, sizeof(unsigned long long)), "memset");
    check(cudaEventRecord(start), "record");
    stream_rows<kFill><<<ctas, kThreadsPerCta, smem>>>(map, a);
    check(cudaGetLastError(), "launch");
    check(cudaEventRecord(stop), "record");
    check(cudaEventSynchronize(stop), "run");
    float t = 0.0f;
    check(cudaEventElapsedTime(&t, start, stop), "elapsed");
    if (rep > 0) ms.push_back(t);  // the first run warms up
  }
  check(cudaMemcpy(&r.checksum, a.checksum, sizeof(r.checksum), cudaMemcpyDeviceToHost), "checksum");
  std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
  r.ms = ms[ms.size() / 2];
  check(cudaEventDestroy(start), "event");
  check(cudaEventDestroy(stop), "event");
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 20;
  bool check_only = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--reps" && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else if (arg == "--check") {
      check_only = true;
    } else {
      std::fprintf(stderr, "usage: caracal_gather_bench [--reps N] [--check]\n  got '%s'\n", arg.c_str());
      return 2;
    }
  }
  int sms = 0;
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "SM count");
  int const hidden = 2048;
  struct Shape {
    const char* name;
    int tokens;
  };
  const Shape shapes[] = {{"x of T 8192 (32 MiB: in L2)", 8192}, {"x of T 65536 (256 MiB: HBM)", 65536}};
  bool ok = true;
  std::printf("%-30s %-9s %5s %8s %9s %10s\n", "matrix (D 2048)", "path", "KiB", "ms", "TB/s", "GB/s an SM");
  for (const Shape& shape : shapes) {
    if (check_only && shape.tokens != 8192) continue;
    size_t const elements = size_t(shape.tokens) * hidden;
    std::vector<uint16_t> host(elements);
    std::mt19937 rng(2026);
    for (uint16_t& v : host) v = uint16_t(rng() & 0x3fffu);  // finite bf16 values
    std::vector<int> order(size_t(shape.tokens));
    std::iota(order.begin(), order.end(), 0);
    if (!check_only) std::shuffle(order.begin(), order.end(), rng);
    __nv_bfloat16* matrix = nullptr;
    int* token_of_row = nullptr;
    unsigned long long* checksum = nullptr;
    check(cudaMalloc(&matrix, elements * 2), "malloc");
    check(cudaMalloc(&token_of_row, order.size() * sizeof(int)), "malloc");
    check(cudaMalloc(&checksum, sizeof(unsigned long long)), "malloc");
    check(cudaMemcpy(matrix, host.data(), elements * 2, cudaMemcpyHostToDevice), "upload");
    check(cudaMemcpy(token_of_row, order.data(), order.size() * sizeof(int), cudaMemcpyHostToDevice), "upload");
    const CUtensorMap map = caracal::gemm::make_tensor_map_2d(matrix, uint64_t(shape.tokens), uint64_t(hidden),
                                                              kBlockM, 64, "matrix");
    for (int boxes = 1; boxes <= kMaxBoxes; ++boxes) {
      Args a{matrix, token_of_row, shape.tokens, hidden, boxes, check_only ? shape.tokens / kBlockM / sms + 1 : 64,
             checksum};
      const Result tma = time_path<Fill::kTma>(map, a, sms, check_only ? 1 : reps);
      const Result gather = time_path<Fill::kGatherPerTile>(map, a, sms, check_only ? 1 : reps);
      const Result per_stage = time_path<Fill::kGatherPerStage>(map, a, sms, check_only ? 1 : reps);
      double const bytes = double(sms) * a.tiles_per_cta * double(kBlockM) * hidden * 2;
      for (const auto& [path, r] : {std::pair<const char*, Result>{"TMA", tma}, {"gathered", gather},
                                    {"gath/stage", per_stage}}) {
        double const tbs = bytes / (r.ms * 1e-3) / 1e12;
        std::printf("%-30s %-9s %5d %8.3f %9.2f %10.1f\n", shape.name, path, boxes * 16, r.ms, tbs,
                    tbs * 1e3 / sms);
      }
      if (check_only && tma.checksum != gather.checksum) {  // (per stage: other rows each stage)
        std::printf("FAILED: the gathered rows' checksum %llu is not the TMA rows' %llu (%d boxes)\n", gather.checksum,
                    tma.checksum, boxes);
        ok = false;
      }
    }
    check(cudaFree(matrix), "free");
    check(cudaFree(token_of_row), "free");
    check(cudaFree(checksum), "free");
  }
  if (check_only && ok) std::printf("checksums equal\n");
  return ok ? 0 : 1;
}
