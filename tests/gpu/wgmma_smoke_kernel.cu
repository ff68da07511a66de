// Smoke-test GEMM for the CUTLASS/CuTe dependency: C[M,N] (fp32) = A[M,K] * B[N,K]^T (bf16,
// both K-major), one 128x128 output tile per CTA.
//
// Structure (the shape the grouped-GEMM engine grows from):
//   - mainloop: thread 0 streams 128x64 tiles of A and B into a kStages-deep ring of 128B-swizzled
//     shared-memory buffers with TMA; every stage has a "full" mbarrier (TMA transaction bytes
//     landed) and an "empty" mbarrier (both warpgroups finished reading it). Two consumer
//     warpgroups each run 64x128x16 wgmma over their half of the tile, operands read straight
//     from shared memory (SS), fp32 accumulators in registers.
//   - epilogue: each thread stores its accumulator fragment directly to C through the tiled MMA's
//     partition of the C tile (no shared-memory staging; fine for a smoke test).
#include "wgmma_smoke_kernel.hpp"

#include <cstdint>

#include <cutlass/arch/barrier.h>
#include <cute/tensor.hpp>  // also brings the GMMA and TMA atoms (include cute/atom/* after it)

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "wgmma_smoke.cu needs the arch-specific Hopper target: -gencode=arch=compute_90a,code=sm_90a"
#endif

namespace caracal::test {
namespace {

using namespace cute;

using Element = cute::bfloat16_t;  // same bits as __nv_bfloat16
static_assert(sizeof(Element) == sizeof(__nv_bfloat16));

using TileShape = Shape<Int<kWgmmaSmokeTileM>, Int<kWgmmaSmokeTileN>, Int<kWgmmaSmokeTileK>>;
constexpr int kStages = 4;  // 4 x 32 KiB of A+B in flight

// K-major operand tiles in the 128B-swizzle atom (8 rows x 64 bf16) that both TMA and the wgmma
// smem descriptors understand; stacked (BLK, 64, kStages).
using SmemLayoutA =
    decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Element>{},
                           make_shape(get<0>(TileShape{}), get<2>(TileShape{}), Int<kStages>{})));
using SmemLayoutB =
    decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<Element>{},
                           make_shape(get<1>(TileShape{}), get<2>(TileShape{}), Int<kStages>{})));

// Two warpgroups stacked along M, each issuing 64x128x16 bf16 wgmma with both operands in smem.
using TiledMma = decltype(make_tiled_mma(
    SM90_64x128x16_F32BF16BF16_SS<GMMA::Major::K, GMMA::Major::K>{}, Layout<Shape<_2, _1, _1>>{}));
constexpr int kThreads = size(TiledMma{});
static_assert(kThreads == 256);

// Bytes the TMA deposits per stage: one A tile and one B tile.
constexpr uint32_t kStageBytes =
    uint32_t(sizeof(Element) * (kWgmmaSmokeTileM + kWgmmaSmokeTileN) * kWgmmaSmokeTileK);

using FullBarrier = cutlass::arch::ClusterTransactionBarrier;
using EmptyBarrier = cutlass::arch::ClusterBarrier;

struct SharedStorage {
  // The swizzle is a function of the address bits, and CuTe's GMMA descriptors assume it starts
  // at a 1024-byte (swizzle-period) boundary; each stage is a multiple of 1024 bytes.
  alignas(1024) ArrayEngine<Element, cosize_v<SmemLayoutA>> a;
  alignas(1024) ArrayEngine<Element, cosize_v<SmemLayoutB>> b;
  uint64_t full[kStages];
  uint64_t empty[kStages];
};

// Accumulates the (m_tile, n_tile) output tile into `accum`: TMA producer (thread 0) and wgmma
// consumers (all threads) synchronised per stage by the full/empty mbarriers.
template <class TmaA, class TmaB, class Accum>
__device__ void mainloop(TmaA const& tma_a, TmaB const& tma_b, SharedStorage& smem,
                         TiledMma& tiled_mma, Accum& accum, int m_tile, int n_tile, int M, int N,
                         int K) {
  // TMA coordinate tensors over the whole operands, tiled to this CTA's row/column of tiles.
  Tensor mA = tma_a.get_tma_tensor(make_shape(M, K));                            // (M,K)
  Tensor mB = tma_b.get_tma_tensor(make_shape(N, K));                            // (N,K)
  Tensor gA = local_tile(mA, select<0, 2>(TileShape{}), make_coord(m_tile, _));  // (BM,BK,k)
  Tensor gB = local_tile(mB, select<1, 2>(TileShape{}), make_coord(n_tile, _));  // (BN,BK,k)

  Tensor sA = make_tensor(make_smem_ptr(smem.a.begin()), SmemLayoutA{});  // (BM,BK,stage)
  Tensor sB = make_tensor(make_smem_ptr(smem.b.begin()), SmemLayoutB{});  // (BN,BK,stage)

  // One TMA instruction moves a whole (BLK,BK) tile: mode 0 is the TMA's, the rest index k/stage.
  // No cluster, so no multicast: CTA coordinate 0 in a 1-CTA layout.
  auto tma_parts_a =
      tma_partition(tma_a, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sA), group_modes<0, 2>(gA));
  auto tma_parts_b =
      tma_partition(tma_b, Int<0>{}, Layout<_1>{}, group_modes<0, 2>(sB), group_modes<0, 2>(gB));
  Tensor tAgA = get<0>(tma_parts_a);  // (TMA,k)
  Tensor tAsA = get<1>(tma_parts_a);  // (TMA,stage)
  Tensor tBgB = get<0>(tma_parts_b);  // (TMA,k)
  Tensor tBsB = get<1>(tma_parts_b);  // (TMA,stage)
  // A stage's full barrier must expect exactly the bytes its two TMA copies deliver.
  static_assert(sizeof(Element) * decltype(size<0>(tAsA) + size<0>(tBsB))::value == kStageBytes);

  // wgmma operands are smem descriptors, not registers: these "fragments" are views of sA/sB.
  auto thr_mma = tiled_mma.get_thread_slice(threadIdx.x);
  Tensor tCrA = thr_mma.make_fragment_A(thr_mma.partition_A(sA));  // (MMA,MMA_M,MMA_K,stage)
  Tensor tCrB = thr_mma.make_fragment_B(thr_mma.partition_B(sB));  // (MMA,MMA_N,MMA_K,stage)

  int const k_tiles = K / kWgmmaSmokeTileK;
  bool const is_producer = threadIdx.x == 0;

  if (is_producer) {
    for (int s = 0; s < kStages; ++s) {
      FullBarrier::init(&smem.full[s], 1);           // the producer's arrive_and_expect_tx
      EmptyBarrier::init(&smem.empty[s], kThreads);  // every consumer thread
    }
    cutlass::arch::fence_barrier_init();  // make the inits visible to the async (TMA) proxy
  }
  __syncthreads();

  auto load_tile = [&](int k_tile) {
    int const s = k_tile % kStages;
    FullBarrier::arrive_and_expect_tx(&smem.full[s], kStageBytes);
    copy(tma_a.with(smem.full[s]), tAgA(_, k_tile), tAsA(_, s));
    copy(tma_b.with(smem.full[s]), tBgB(_, k_tile), tBsB(_, s));
  };

  if (is_producer) {
    for (int k_tile = 0; k_tile < min(kStages, k_tiles); ++k_tile) load_tile(k_tile);
  }

  // The first wgmma overwrites the accumulators, so they need no clearing.
  tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;

  CUTE_NO_UNROLL
  for (int k_tile = 0; k_tile < k_tiles; ++k_tile) {
    int const s = k_tile % kStages;
    // Stage s is on its (k_tile / kStages)-th use; mbarrier waits name the phase by parity.
    uint32_t const phase = uint32_t(k_tile / kStages) & 1u;
    FullBarrier::wait(&smem.full[s], phase);

    // Fences keep the compiler from moving accumulator reads/writes across the async wgmma.
    warpgroup_fence_operand(accum);
    warpgroup_arrive();
    CUTE_UNROLL
    for (int k_block = 0; k_block < size<2>(tCrA); ++k_block) {
      cute::gemm(tiled_mma, tCrA(_, _, k_block, s), tCrB(_, _, k_block, s), accum);
      tiled_mma.accumulate_ = GMMA::ScaleOut::One;
    }
    warpgroup_commit_batch();
    warpgroup_wait<0>();  // this stage's wgmmas have finished reading shared memory
    warpgroup_fence_operand(accum);

    EmptyBarrier::arrive(&smem.empty[s]);
    int const next = k_tile + kStages;
    if (is_producer && next < k_tiles) {
      // Refill stage s only once both warpgroups have released it.
      EmptyBarrier::wait(&smem.empty[s], phase);
      load_tile(next);
    }
  }
}

// Stores the fp32 accumulator fragment to the (m_tile, n_tile) tile of row-major C.
template <class Accum>
__device__ void epilogue(TiledMma const& tiled_mma, Accum const& accum, float* C, int m_tile,
                         int n_tile, int M, int N) {
  Tensor mC =
      make_tensor(make_gmem_ptr(C), make_shape(M, N), make_stride(int64_t(N), Int<1>{}));  // (M,N)
  Tensor gC = local_tile(mC, select<0, 1>(TileShape{}), make_coord(m_tile, n_tile));  // (BM,BN)
  Tensor tCgC = tiled_mma.get_thread_slice(threadIdx.x).partition_C(gC);  // (MMA,MMA_M,MMA_N)
  // Each thread owns pairs of adjacent columns. C is 16-byte aligned and N and every column
  // offset of a pair are even, so each pair is 8-byte aligned: store it as one 64-bit vector.
  copy(AutoVectorizingCopyWithAssumedAlignment<64>{}, accum, tCgC);
}

template <class TmaA, class TmaB>
__global__ void __launch_bounds__(kThreads, 1)
    wgmma_smoke_kernel(CUTE_GRID_CONSTANT TmaA const tma_a, CUTE_GRID_CONSTANT TmaB const tma_b,
                       float* C, int M, int N, int K) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  SharedStorage& smem = *reinterpret_cast<SharedStorage*>(smem_raw);

  int const m_tile = int(blockIdx.x);
  int const n_tile = int(blockIdx.y);

  TiledMma tiled_mma;
  Tensor accum = partition_fragment_C(tiled_mma, select<0, 1>(TileShape{}));  // (MMA,MMA_M,MMA_N)
  mainloop(tma_a, tma_b, smem, tiled_mma, accum, m_tile, n_tile, M, N, K);
  epilogue(tiled_mma, accum, C, m_tile, n_tile, M, N);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

cudaError_t wgmma_smoke_gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, float* C, int M, int N,
                             int K, cudaStream_t stream) {
  bool const sizes_ok = M > 0 && N > 0 && K > 0 && M % kWgmmaSmokeTileM == 0 &&
                        N % kWgmmaSmokeTileN == 0 && K % kWgmmaSmokeTileK == 0 &&
                        N / kWgmmaSmokeTileN <= 65535;  // gridDim.y limit
  bool const pointers_ok = A && B && C && aligned16(A) && aligned16(B) && aligned16(C);
  if (!sizes_ok || !pointers_ok) return cudaErrorInvalidValue;

  // TMA descriptors for the K-major operands, one (BLK,BK) box per copy, landing in stage 0's
  // swizzled layout (every stage has the same layout).
  Tensor mA = make_tensor(make_gmem_ptr(reinterpret_cast<Element const*>(A)), make_shape(M, K),
                          make_stride(int64_t(K), Int<1>{}));
  Tensor mB = make_tensor(make_gmem_ptr(reinterpret_cast<Element const*>(B)), make_shape(N, K),
                          make_stride(int64_t(K), Int<1>{}));
  auto tma_a =
      make_tma_atom(SM90_TMA_LOAD{}, mA, SmemLayoutA{}(_, _, 0), select<0, 2>(TileShape{}));
  auto tma_b =
      make_tma_atom(SM90_TMA_LOAD{}, mB, SmemLayoutB{}(_, _, 0), select<1, 2>(TileShape{}));

  auto* kernel = &wgmma_smoke_kernel<decltype(tma_a), decltype(tma_b)>;
  constexpr int smem_bytes = int(sizeof(SharedStorage));
  cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
  if (err != cudaSuccess) return err;

  dim3 const grid(unsigned(M / kWgmmaSmokeTileM), unsigned(N / kWgmmaSmokeTileN));
  kernel<<<grid, kThreads, smem_bytes, stream>>>(tma_a, tma_b, C, M, N, K);
  return cudaGetLastError();
}

}  // namespace caracal::test
