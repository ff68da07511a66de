#pragma once
// The persistent, warp-specialized grouped-GEMM kernel: warpgroup 0 produces (TMA), warpgroups
// 1 and 2 consume (wgmma + epilogue). Each CTA walks its tiles from the Gemm's scheduler;
// producer and consumers meet only through the stage ring, so the producer loads the next tile
// while the consumers run the epilogue of the last.
//
// `Gemm` describes one kernel:
//   OperandA, OperandB  operand kinds (operand_loads.cuh): their majorness and TMA loads
//   Scheduler           RowTileScheduler (M = rows) or WeightTileScheduler (K = rows)
//   Epilogue            apply(p, tile, accum, active, ring, warpgroup) per tile and warpgroup
#include <cstdint>

#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/tensor.hpp>
#include <cutlass/arch/reg_reconfig.h>

#include "kernels/gemm/chunk_store.cuh"
#include "kernels/gemm/gemm_config.cuh"
#include "kernels/gemm/mainloop.cuh"
#include "kernels/gemm/mma_config.cuh"
#include "kernels/gemm/tile_coord.cuh"
#include "kernels/gemm/tma_pipeline.cuh"

namespace caracal::kernels::gemm {

template <class Gemm>
__global__ void __launch_bounds__(kThreads, 1)
    grouped_gemm_kernel(CUTE_GRID_CONSTANT Params const p) {
  using namespace cute;
  using Mma = MmaConfig<Gemm::OperandA::kMajor, Gemm::OperandB::kMajor>;
  extern __shared__ uint8_t smem_raw[];
  // Round the base up to the 1024-byte swizzle period (kSmemBytes holds the slack).
  SharedStorage& smem = *reinterpret_cast<SharedStorage*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));

  // Warp-uniform role indices (the shuffle tells the compiler they are uniform).
  int const warpgroup = __shfl_sync(0xffffffffu, int(threadIdx.x) / kWarpgroupThreads, 0);
  int const lane = int(threadIdx.x) % 32;

  TmaPipeline const pipe(smem.full, smem.empty);
  if (threadIdx.x == 0) {
    pipe.init();
    prefetch_tma_descriptor(&p.a);
    prefetch_tma_descriptor(&p.b);
  }
  __syncthreads();

  typename Gemm::Scheduler scheduler(p);

  if (warpgroup == 0) {
    // Producer: one thread issues every TMA load; the rest of the warpgroup retires.
    cutlass::arch::warpgroup_reg_dealloc<kProducerRegisters>();
    if (threadIdx.x == 0) {
      PipelineState st;
      for (; scheduler.has_tile(); scheduler.advance()) {
        load_tile<Gemm>(p, smem, pipe, st, scheduler.coord());
      }
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<kConsumerRegisters>();
    int const consumer = warpgroup - 1;                       // 0 or 1
    int const thread = int(threadIdx.x) - kWarpgroupThreads;  // 0..255
    int const wg_thread = thread % kWarpgroupThreads;

    // wgmma operands are shared-memory descriptors: these "fragments" are views of the stages.
    typename Mma::TiledMma tiled_mma;
    auto thr_mma = tiled_mma.get_thread_slice(thread);
    Tensor sA = make_tensor(make_smem_ptr(&smem.a[0][0]), typename Mma::SmemLayoutA{});
    Tensor sB = make_tensor(make_smem_ptr(&smem.b[0][0]), typename Mma::SmemLayoutB{});
    Tensor tCrA = thr_mma.make_fragment_A(thr_mma.partition_A(sA));  // (MMA, MMA_M, MMA_K, stage)
    Tensor tCrB = thr_mma.make_fragment_B(thr_mma.partition_B(sB));  // (MMA, MMA_N, MMA_K, stage)
    Tensor accum = partition_fragment_C(tiled_mma, Shape<Int<kBlockM>, Int<kBlockN>>{});
    static_assert(decltype(size(accum))::value == kAccumulators);

    ChunkStoreRing ring(smem.chunks[consumer], consumer, wg_thread);
    PipelineState st;
    for (; scheduler.has_tile(); scheduler.advance()) {
      TileCoord const tile = scheduler.coord();
      bool const active = tile.m_begin + consumer * kWarpgroupRows < tile.active_end;
      mma_tile(tiled_mma, tCrA, tCrB, accum, pipe, st, tile.k_tiles, active, lane);
      Gemm::Epilogue::apply(p, tile, accum, active, ring, consumer);
    }
    ring.drain();
  }
}

}  // namespace caracal::kernels::gemm
