#pragma once
// The fused forward's compute role: the grouped-GEMM CTA of grouped_gemm_kernel.cuh (warpgroup 0
// produces with TMA, warpgroups 1 and 2 run wgmma and the epilogue) running the rank's tasks
// (forward_tasks.cuh) as it takes them from the rank's task counter. Before loading a tile's A rows
// the producer waits for them: an up/gate tile for its block's x rows (x_ready, raised by the comm
// role), a down tile for its block's activation (activation_ready, raised below by the up/gate
// tiles' epilogues once their TMA stores have completed).
//
// The producer hands each tile's task (phase and coordinates) to the consumers through the CTA's
// task slots (forward_tasks.cuh), the slot of the tile's first stage; ForwardPhase::end there,
// with a bare arrival, ends the consumers' walk: when the tasks run out, and when a wait fails
// (timeout or aborted world, recorded for World::check; the layer poisons the outputs of such a
// pass).
#include <cstdint>

#include <cute/tensor.hpp>
#include <cutlass/arch/reg_reconfig.h>

#include "device/comm/cta_place.cuh"
#include "device/comm/device_world.cuh"
#include "device/comm/ready_flags.cuh"
#include "device/gemm/chunk_store.cuh"
#include "device/gemm/gemm_config.cuh"
#include "device/gemm/grouped_gemm_kernel.cuh"
#include "device/gemm/mainloop.cuh"
#include "device/gemm/mma_config.cuh"
#include "device/gemm/tma_pipeline.cuh"
#include "kernels/fused/forward_params.cuh"
#include "kernels/fused/forward_tasks.cuh"

namespace caracal::fused {

// setmaxnreg budgets: the producer also takes tasks and waits on counters (the standalone GEMM's 40
// registers spill here); 56 x 128 + 224 x 256 = 64512 <= 65536 registers of the SM.
inline constexpr uint32_t kFusedProducerRegisters = 56;
inline constexpr uint32_t kFusedConsumerRegisters = 224;

// The producer thread: takes tasks, waits for each one's A rows, then streams its operands.
__device__ inline void produce_forward_tiles(const comm::DeviceWorld& world, const comm::CtaPlace& place,
                                             const FusedForwardRankParams& p, gemm::MainloopStorage& smem,
                                             const gemm::TmaPipeline& pipe, TaskSlot* stage_task) {
  const uint32_t activation_complete = 2u * static_cast<uint32_t>(p.up_tiles.n_blocks);
  ForwardTaskCursor tasks(p.up_tiles, p.down_tiles);
  gemm::PipelineState st;
  for (;;) {
    const int t = static_cast<int>(atomicAdd(p.task_counter, 1u));
    if (t >= tasks.num_tasks(p.up_tiles)) break;
    const ForwardTask task = tasks.at(t);
    const int block = task.m_block();
    const bool up = task.phase == ForwardPhase::up_gate;
    const bool ready = up ? comm::wait_ready_thread(world, place, p.x_ready + block, gemm::kBlockM, block)
                          : comm::wait_ready_thread(world, place, p.activation_ready + block, activation_complete, block);
    if (!ready) break;
    comm::async_proxy_fence();  // the rows were published through the generic proxy
    pipe.producer_acquire(st);  // the slot's last task has been read
    stage_task[st.stage].task = task;
    if (up) {
      gemm::load_tile<UpGateGemm>(p.up_mainloop, p.up_epilogue, smem, pipe, st, task.tile);
    } else {
      gemm::load_tile<DownGemm>(p.down_mainloop, p.down_epilogue, smem, pipe, st, task.tile);
    }
  }
  pipe.producer_acquire(st);
  stage_task[st.stage].task.phase = ForwardPhase::end;
  cutlass::arch::ClusterBarrier::arrive(&smem.full[st.stage]);
}

// A consumer warpgroup: wgmma over each task's stages, then the task's epilogue. After an up/gate
// tile the warpgroup's leader (the thread that issued its TMA stores) waits for the stores to
// complete and raises the block's activation_ready.
template <class TiledMma, class FragA, class FragB, class Accum>
__device__ void consume_forward_tiles(const FusedForwardRankParams& p, TiledMma& tiled_mma, const FragA& tCrA,
                                      const FragB& tCrB, Accum& accum, const gemm::TmaPipeline& pipe,
                                      gemm::ChunkStoreRing& ring, int consumer, int wg_thread,
                                      TaskSlot* stage_task) {
  const int lane = wg_thread % 32;
  gemm::PipelineState st;
  for (;;) {
    pipe.consumer_wait(st);  // the tile's first stage, and with it its task
    const ForwardTask task = stage_task[st.stage].task;
    if (task.phase == ForwardPhase::end) break;
    const bool active = task.tile.m_begin + consumer * gemm::kWarpgroupRows < task.tile.active_end;
    gemm::mma_tile(tiled_mma, tCrA, tCrB, accum, pipe, st, task.tile.k_tiles, active, lane);
    if (task.phase == ForwardPhase::up_gate) {
      UpGateGemm::Epilogue::apply(p.up_epilogue, task.tile, accum, active, ring, consumer);
      ring.drain();  // this warpgroup's stores of the slice have completed
      if (wg_thread == 0) {
        comm::async_proxy_fence();
        comm::signal_ready_thread(p.activation_ready + task.m_block());
      }
    } else {
      DownGemm::Epilogue::apply(p.down_epilogue, task.tile, accum, active, ring, consumer);
    }
  }
  ring.drain();
}

// One compute CTA (all kThreads threads).
__device__ inline void run_forward_tasks(const comm::DeviceWorld& world, const comm::CtaPlace& place,
                                         const FusedForwardRankParams& p, gemm::KernelStorage& smem,
                                         TaskSlot* stage_task) {
  using namespace cute;
  using namespace gemm;
  using Mma = MmaConfig<UpGateGemm::OperandA::kMajor, UpGateGemm::OperandB::kMajor>;
  static_assert(std::is_same_v<Mma, MmaConfig<DownGemm::OperandA::kMajor, DownGemm::OperandB::kMajor>>);
  const int warpgroup = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / kWarpgroupThreads, 0);

  const TmaPipeline pipe(smem.mainloop.full, smem.mainloop.empty);
  if (threadIdx.x == 0) {
    pipe.init();
    prefetch_tma_descriptor(&p.up_mainloop.a);
    prefetch_tma_descriptor(&p.up_mainloop.b);
    prefetch_tma_descriptor(&p.down_mainloop.a);
    prefetch_tma_descriptor(&p.down_mainloop.b);
  }
  __syncthreads();

  if (warpgroup == 0) {
    cutlass::arch::warpgroup_reg_dealloc<kFusedProducerRegisters>();
    if (threadIdx.x == 0) produce_forward_tiles(world, place, p, smem.mainloop, pipe, stage_task);
    return;
  }
  cutlass::arch::warpgroup_reg_alloc<kFusedConsumerRegisters>();
  const int consumer = warpgroup - 1;
  const int thread = static_cast<int>(threadIdx.x) - kWarpgroupThreads;
  const int wg_thread = thread % kWarpgroupThreads;
  typename Mma::TiledMma tiled_mma;
  auto thr_mma = tiled_mma.get_thread_slice(thread);
  Tensor sA = make_tensor(make_smem_ptr(&smem.mainloop.a[0][0]), typename Mma::SmemLayoutA{});
  Tensor sB = make_tensor(make_smem_ptr(&smem.mainloop.b[0][0]), typename Mma::SmemLayoutB{});
  Tensor tCrA = thr_mma.make_fragment_A(thr_mma.partition_A(sA));
  Tensor tCrB = thr_mma.make_fragment_B(thr_mma.partition_B(sB));
  Tensor accum = partition_fragment_C(tiled_mma, Shape<Int<kBlockM>, Int<kBlockN>>{});
  ChunkStoreRing ring(smem.epilogue.chunks[consumer], consumer, wg_thread);
  consume_forward_tiles(p, tiled_mma, tCrA, tCrB, accum, pipe, ring, consumer, wg_thread, stage_task);
}

}  // namespace caracal::fused
