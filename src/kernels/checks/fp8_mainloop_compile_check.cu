// The block-scaled FP8 mainloop (Fp8BlockScaledGemmPolicy, device/gemm/block_scaled_mainloop.cuh)
// instantiated as the grouped-GEMM kernels' skeleton runs a mainloop: warpgroup 0's thread loads a
// tile's operands and scales (load_tile), warpgroups 1 and 2 run its wgmmas with the promotion per
// 128-wide K block (mma_tile), each consumer thread's accumulators stored as they lie. It shows
// that a precision is a policy: this unit compiles under the build's ptxas rules (no spills, no
// serialized wgmma). Compiled, never launched: nothing links its library (CMakeLists.txt,
// caracal_compile_checks).
#include <cstdint>

#include <cute/tensor.hpp>
#include <cutlass/arch/reg_reconfig.h>

#include "device/gemm/block_scaled_mainloop.cuh"
#include "device/gemm/gemm_config.cuh"
#include "device/gemm/gemm_policy.cuh"
#include "device/gemm/grouped_gemm_kernel.cuh"
#include "device/gemm/mainloop.cuh"
#include "device/gemm/mma_config.cuh"
#include "device/gemm/operand_loads.cuh"
#include "device/gemm/tile_coord.cuh"
#include "device/gemm/tma_pipeline.cuh"

namespace caracal::gemm {

// An FP8 up/gate-shaped GEMM: e4m3 row tiles times e4m3 expert weights, both K-major, no epilogue.
struct Fp8MainloopCheckGemm {
  using Policy = Fp8BlockScaledGemmPolicy;
  using OperandA = KMajorRows;
  using OperandB = KMajorWeights;
  struct Epilogue {
    struct Params {};
  };
};

struct Fp8MainloopCheckParams {
  Mainloop<Fp8BlockScaledGemmPolicy>::Params mainloop;
  int rows;     // A's rows: tile (x, y) computes rows [128 x, 128 x + 128), columns [128 y, 128 y + 128)
  int k_tiles;  // K / 128
  float* out;   // [CTAs][256 consumer threads][64]: each thread's accumulators
};

__global__ void __launch_bounds__(kThreads, 1)
    fp8_mainloop_compile_check(CUTE_GRID_CONSTANT Fp8MainloopCheckParams const p) {
  using namespace cute;
  using Gemm = Fp8MainloopCheckGemm;
  using Policy = Gemm::Policy;
  using Mma = MmaConfigOf<Gemm>;
  constexpr RegisterSplit kRegisters = checked_register_split<Gemm>();
  extern __shared__ uint8_t smem_raw[];
  KernelStorage<Policy>& smem = kernel_storage<Policy>(smem_raw);

  int const warpgroup = __shfl_sync(0xffffffffu, int(threadIdx.x) / kWarpgroupThreads, 0);
  int const lane = int(threadIdx.x) % 32;
  TmaPipeline const pipe(smem.mainloop.full, smem.mainloop.empty);
  if (threadIdx.x == 0) {
    pipe.init();
    Mainloop<Policy>::prefetch_descriptors(p.mainloop);
  }
  __syncthreads();

  TileCoord tile;
  tile.expert = 0;
  tile.m_begin = int(blockIdx.x) * Policy::kBlockM;
  tile.m_buffer = tile.m_begin;
  tile.n_begin = int(blockIdx.y) * Policy::kBlockN;
  tile.k_begin = 0;
  tile.k_tiles = p.k_tiles;
  tile.active_end = p.rows;

  if (warpgroup == 0) {
    cutlass::arch::warpgroup_reg_dealloc<kRegisters.producer>();
    if (threadIdx.x == 0) {
      PipelineState<Policy::kStages> st;
      load_tile<Gemm>(p.mainloop, {}, smem.mainloop, pipe, st, tile);
    }
    return;
  }
  cutlass::arch::warpgroup_reg_alloc<kRegisters.consumer>();
  int const consumer = warpgroup - 1;
  int const thread = int(threadIdx.x) - kWarpgroupThreads;
  typename Mma::TiledMma tiled_mma;
  Tensor tCrA = stage_fragment_a<Mma>(tiled_mma, smem.mainloop, thread);
  Tensor tCrB = stage_fragment_b<Mma>(tiled_mma, smem.mainloop, thread);
  auto const scales = Mainloop<Policy>::stage_scales(smem.mainloop, thread);
  Tensor accum = partition_fragment_C(tiled_mma, Shape<Int<Policy::kBlockM>, Int<Policy::kBlockN>>{});
  PipelineState<Policy::kStages> st;
  bool const active = tile.k_tiles > 0 && tile.m_begin + consumer * kWarpgroupRows < tile.active_end;
  mma_tile(tiled_mma, tCrA, tCrB, scales, accum, pipe, st, tile.k_tiles, active, lane);
  if (!active) return;
  int const cta = int(blockIdx.y * gridDim.x + blockIdx.x);
  float* const out = p.out + (int64_t(cta) * kConsumerWarpgroups * kWarpgroupThreads + thread) * size(accum);
  CUTE_UNROLL
  for (int i = 0; i < size(accum); ++i) out[i] = accum(i);
}

}  // namespace caracal::gemm
