// caracal_pull_engine_bench: how fast a few CTAs pull gathered rows, by engine: warp-wide 16-byte
// copies (row_copy.cuh, v1's dispatch) or bulk asynchronous copies through shared memory
// (bulk_row_pull.cuh, the fused forward's comm role), with 1, 2 or 4 issuing threads per CTA.
// The fused kernels give a handful of CTAs to communication, so what one CTA moves decides how
// many it needs. Rows: R destination rows of D bf16, each from a token (of T) in a scattered order.
// Prints GB/s of (read + written) bytes, median of --reps runs, per engine and CTA count.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "device/transfer/bulk_row_pull.cuh"
#include "device/transfer/row_copy.cuh"

namespace caracal::bench {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

__device__ int source_token(int row, int tokens) { return static_cast<int>((static_cast<int64_t>(row) * 7919) % tokens); }

template <int kDepth>
__global__ void __launch_bounds__(384, 1) warp_pull(const __nv_bfloat16* x, __nv_bfloat16* out, int rows, int tokens, int hidden) {
  const int warps = static_cast<int>(gridDim.x * blockDim.x / 32);
  const int warp = static_cast<int>((blockIdx.x * blockDim.x + threadIdx.x) / 32);
  const int lane = static_cast<int>(threadIdx.x % 32);
  for (int r = warp; r < rows; r += warps) {
    uint4* dst = transfer::row_vectors(out, r, hidden);
    const uint4* src = transfer::row_vectors(x, source_token(r, tokens), hidden);
    if constexpr (kDepth == 0) {
      transfer::warp_copy_row<true>(dst, src, hidden / 8, lane);
    } else {
      transfer::warp_copy_row_deep<kDepth, true>(dst, src, hidden / 8, lane);
    }
  }
}

template <int kIssuers>
__global__ void __launch_bounds__(384, 1) bulk_pull(const __nv_bfloat16* x, __nv_bfloat16* out, int rows, int tokens, int hidden,
                                                    int smem_bytes) {
  extern __shared__ __align__(1024) uint8_t smem[];
  __shared__ uint64_t full[kIssuers][transfer::kBulkPullMaxStages];
  const int row_bytes = hidden * 2;
  const int share = smem_bytes / kIssuers / 1024 * 1024;
  const int issuer = static_cast<int>(threadIdx.x) / 32;
  // Each issuer's slice; bulk_pull_init zeroes and initializes one slice with all threads.
  for (int i = 0; i < kIssuers; ++i) {
    transfer::bulk_pull_init({smem + i * share, full[i], transfer::bulk_pull_stages(share, row_bytes), row_bytes});
  }
  if (threadIdx.x % 32 != 0 || issuer >= kIssuers) return;
  const transfer::BulkPullSmem s{smem + issuer * share, full[issuer], transfer::bulk_pull_stages(share, row_bytes), row_bytes};
  const int stride = static_cast<int>(gridDim.x) * kIssuers;
  const int first = static_cast<int>(blockIdx.x) * kIssuers + issuer;
  const int mine = rows > first ? (rows - first + stride - 1) / stride : 0;
  transfer::pull_rows_bulk(
      s, mine, [&](int j) -> const void* { return x + static_cast<int64_t>(source_token(first + j * stride, tokens)) * hidden; },
      [&](int j) -> void* { return out + static_cast<int64_t>(first + j * stride) * hidden; }, [](int) {});
}

template <typename Launch>
double median_ms(Launch launch, int reps) {
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "event");
  check(cudaEventCreate(&b), "event");
  for (int i = 0; i < 3; ++i) launch();
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i) {
    check(cudaEventRecord(a), "record");
    launch();
    check(cudaEventRecord(b), "record");
    check(cudaEventSynchronize(b), "sync");
    float t = 0;
    check(cudaEventElapsedTime(&t, a, b), "elapsed");
    ms.push_back(t);
  }
  check(cudaGetLastError(), "launch");
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace
}  // namespace caracal::bench

int main(int argc, char** argv) {
  using namespace caracal::bench;
  const int rows = argc > 1 ? std::atoi(argv[1]) : 32768;
  const int tokens = argc > 2 ? std::atoi(argv[2]) : 4096;
  const int hidden = argc > 3 ? std::atoi(argv[3]) : 7168;
  const int reps = 10;
  __nv_bfloat16 *x = nullptr, *out = nullptr;
  check(cudaMalloc(&x, size_t(tokens) * hidden * 2), "cudaMalloc x");
  check(cudaMalloc(&out, size_t(rows) * hidden * 2), "cudaMalloc out");
  check(cudaMemset(x, 1, size_t(tokens) * hidden * 2), "memset");
  const int smem_bytes = 227 * 1024 - 2048;
  check(cudaFuncSetAttribute(bulk_pull<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes), "attr");
  check(cudaFuncSetAttribute(bulk_pull<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes), "attr");
  check(cudaFuncSetAttribute(bulk_pull<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes), "attr");
  const double bytes = 2.0 * rows * hidden * 2;
  std::printf("pull engines: %d rows of D=%d from %d tokens, GB/s of (read + written) bytes\n", rows, hidden, tokens);
  std::printf("%6s %10s %10s %10s %10s %10s %10s %10s   (0: the issuer's share holds too few stages)\n", "CTAs",
              "warp", "deep 8", "deep 16", "deep 28", "bulk x1", "bulk x2", "bulk x4");
  for (const int ctas : {1, 2, 4, 8, 16, 32, 132}) {
    const double w = median_ms([&] { warp_pull<0><<<ctas, 384>>>(x, out, rows, tokens, hidden); }, reps);
    const double d8 = median_ms([&] { warp_pull<8><<<ctas, 384>>>(x, out, rows, tokens, hidden); }, reps);
    const double d16 = median_ms([&] { warp_pull<16><<<ctas, 384>>>(x, out, rows, tokens, hidden); }, reps);
    const double d28 = median_ms([&] { warp_pull<28><<<ctas, 384>>>(x, out, rows, tokens, hidden); }, reps);
    const auto bulk = [&](auto launch, int issuers) {
      // An issuer needs more stages than the stores it lets read behind its loads.
      const int share = smem_bytes / issuers / 1024 * 1024;
      if (caracal::transfer::bulk_pull_stages(share, hidden * 2) <= caracal::transfer::kStoresReading) return 0.0;
      return bytes / median_ms(launch, reps) * 1e-6;
    };
    const double b1 = bulk([&] { bulk_pull<1><<<ctas, 384, smem_bytes>>>(x, out, rows, tokens, hidden, smem_bytes); }, 1);
    const double b2 = bulk([&] { bulk_pull<2><<<ctas, 384, smem_bytes>>>(x, out, rows, tokens, hidden, smem_bytes); }, 2);
    const double b4 = bulk([&] { bulk_pull<4><<<ctas, 384, smem_bytes>>>(x, out, rows, tokens, hidden, smem_bytes); }, 4);
    std::printf("%6d %10.1f %10.1f %10.1f %10.1f %10.1f %10.1f %10.1f\n", ctas, bytes / w * 1e-6, bytes / d8 * 1e-6,
                bytes / d16 * 1e-6, bytes / d28 * 1e-6, b1, b2, b4);
    std::fflush(stdout);
  }
  return 0;
}
