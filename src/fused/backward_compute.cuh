#pragma once
// The fused backward's compute role, over the GEMMs of its precision (`Gemms`, backward_gemms.cuh):
// the persistent task kernel's CTA (persistent_task_kernel.cuh:
// warpgroup 0 produces, warpgroups 1 and 2 run wgmma and the epilogue; warpgroup 0's warps 1-3, idle there,
// copy rows or sum dx groups under the tiles, backward.cu) running the rank's tasks
// (backward_tasks.cuh) as it takes them from the rank's task counter. Both GEMMs load their
// operands by TMA: a dgrad tile's dy rows from the ring once all of its block's rows are there
// (dy_ready: the comm role's count, backward_pull.cuh), a dx tile's d_gate_up once its block's dgrad
// tiles have stored it (dgrad_done, raised below by their epilogues after the TMA stores completed).
// The dgrad's rows are not gathered where they are, as the fused forward's up/gate rows are: that
// gather is slower than TMA loads of the same rows by more than the copy of dy into the ring costs.
// The producer thread
// hands each tile's task to the consumers through the CTA's task slot of the tile's first stage, as
// the fused forward's (forward_compute.cuh); BackwardPhase::end there ends the consumers' walk: when
// the tasks run out, and when a wait fails (timeout or aborted world, recorded for World::check; the
// layer poisons the outputs of such a pass).
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
#include "device/gemm/persistent_task_kernel.cuh"
#include "device/gemm/tma_pipeline.cuh"
#include "fused/backward_gemms.cuh"
#include "fused/backward_params.cuh"
#include "fused/backward_tasks.cuh"
#include "fused/task_slots.cuh"

namespace caracal::fused {

template <class Gemms>
using BackwardPipeline = gemm::TmaPipeline<Gemms::Policy::kStages>;

// The producer thread: takes tasks, waits for each one's A rows, streams its operands by TMA.
template <class Gemms>
__device__ inline void produce_backward_tiles(const comm::DeviceWorld& world, const comm::CtaPlace& place,
                                              const FusedBackwardRankParams<Gemms>& p,
                                              typename gemm::Mainloop<typename Gemms::Policy>::Storage& smem,
                                              const BackwardPipeline<Gemms>& pipe) {
  constexpr int kStages = Gemms::Policy::kStages;
  BackwardTaskCursorOf<Gemms::Policy::kBlockN> tasks(p.tiles);
  typename BackwardPipeline<Gemms>::State st;
  for (;;) {
    // The task is taken once its first stage is free, so the tiles in flight stay consecutive.
    pipe.producer_acquire(st);
    const int t = static_cast<int>(atomicAdd(p.task_counter, 1u));
    if (t >= tasks.num_tasks()) break;
    const BackwardTask task = tasks.at(t);
    const int block = task.buffer_block();
    // A routed dgrad tile waits for its block's dy rows, a dx tile for its block's d_gate_up; the
    // shared expert's dgrad tiles for nothing (its dy and gate/up were there before the launch).
    bool ready = true;
    switch (task.phase) {
      case BackwardPhase::dgrad:
        ready = comm::wait_ready_thread(world, place, p.dy_ready + block, gemm::kBlockM, block);
        break;
      case BackwardPhase::dx:
        ready = comm::wait_ready_thread(world, place, p.dgrad_done + block,
                                        2u * static_cast<uint32_t>(p.tiles.dgrad.n_blocks), block);
        break;
      case BackwardPhase::shared_dx:
        ready = comm::wait_ready_thread(world, place, p.shared_dgrad_done + block,
                                        2u * static_cast<uint32_t>(p.tiles.shared_dgrad.n_blocks), block);
        break;
      default:
        break;
    }
    if (!ready) break;
    comm::async_proxy_fence();  // what the counter guards was published through the generic proxy
    p.task_slots[first_task_slot<kStages>(world) + st.stage].task = task;
    switch (task.phase) {
      case BackwardPhase::shared_dgrad:
        gemm::load_tile<typename Gemms::Dgrad>(p.shared_dgrad_mainloop, p.shared_dgrad_epilogue, smem, pipe, st,
                                               task.tile);
        break;
      case BackwardPhase::shared_dx:
        gemm::load_tile<typename Gemms::SharedDx>(p.shared_dx_mainloop, p.shared_dx_epilogue, smem, pipe, st,
                                                  task.tile);
        break;
      case BackwardPhase::dgrad:
        gemm::load_tile<typename Gemms::Dgrad>(p.dgrad_mainloop, p.dgrad_epilogue, smem, pipe, st, task.tile);
        break;
      default:
        gemm::load_tile<typename Gemms::Dx>(p.dx_mainloop, p.dx_epilogue, smem, pipe, st, task.tile);
        break;
    }
  }
  pipe.producer_acquire(st);
  p.task_slots[first_task_slot<kStages>(world) + st.stage].task.phase = BackwardPhase::end;
  pipe.producer_arrive(st);
}

// A consumer warpgroup: wgmma over each task's stages, then the task's epilogue. After a dgrad
// tile the warpgroup's leader (the thread that issued its TMA stores) waits for the stores to
// complete and raises the block's dgrad_done; after a dx tile whose rows the dx sums read
// (dx_group_sums.cuh), the warpgroup's leader raises the block's dx_done once the warpgroup's
// threads issued their stores.
template <class Gemms, class TiledMma, class FragA, class FragB, class StageScales, class Accum>
__device__ void consume_backward_tiles(const comm::DeviceWorld& world, const FusedBackwardRankParams<Gemms>& p,
                                       TiledMma& tiled_mma, const FragA& tCrA, const FragB& tCrB,
                                       const StageScales& scales, Accum& accum,
                                       const BackwardPipeline<Gemms>& pipe, gemm::ChunkStoreRing& ring, int consumer,
                                       int wg_thread) {
  const int lane = wg_thread % 32;
  typename BackwardPipeline<Gemms>::State st;
  for (;;) {
    pipe.consumer_wait(st);  // the tile's first stage, and with it its task
    const BackwardTask task = p.task_slots[first_task_slot<Gemms::Policy::kStages>(world) + st.stage].task;
    if (task.phase == BackwardPhase::end) break;
    const bool active = task.tile.m_begin + consumer * gemm::kWarpgroupRows < task.tile.active_end;
    gemm::mma_tile(tiled_mma, tCrA, tCrB, scales, accum, pipe, st, task.tile.k_tiles, active, lane);
    if (task.dgrad()) {
      const bool shared = task.shared();
      Gemms::apply_dgrad_epilogue(shared ? p.shared_dgrad_epilogue : p.dgrad_epilogue, task.tile, accum, active, ring,
                                  consumer);
      ring.drain();  // this warpgroup's stores of the slice have completed
      if (wg_thread == 0) {
        comm::async_proxy_fence();
        comm::signal_ready_thread((shared ? p.shared_dgrad_done : p.dgrad_done) + task.buffer_block());
      }
    } else if (task.phase == BackwardPhase::shared_dx) {
      Gemms::SharedDx::Epilogue::apply(p.shared_dx_epilogue, task.tile, accum, active, ring, consumer);
    } else {
      Gemms::Dx::Epilogue::apply(p.dx_epilogue, task.tile, accum, active, ring, consumer);
      if (p.tiles.group_dx) {
        ring.plain_stores_issued();  // one release per warpgroup publishes its threads' row stores
        if (wg_thread == 0) comm::signal_ready_thread(p.dx_done + task.buffer_block());
      }
    }
  }
}

// One compute CTA (all kThreads threads) on the persistent task kernel's skeleton. Warpgroup 0's
// warps 1-3, idle in the GEMMs, call idle_work(w) with w = 0, 1, 2 (the copies of
// backward_local_rows.cuh, the dx sums).
template <class Gemms, class IdleWork>
__device__ void run_backward_tasks(const comm::DeviceWorld& world, const comm::CtaPlace& place,
                                   const FusedBackwardRankParams<Gemms>& p,
                                   gemm::KernelStorage<typename Gemms::Policy>& smem, IdleWork&& idle_work) {
  using namespace gemm;
  using Mma = MmaConfigOf<typename Gemms::Dgrad>;
  static_assert(std::is_same_v<Mma, MmaConfigOf<typename Gemms::Dx>> &&
                std::is_same_v<Mma, MmaConfigOf<typename Gemms::SharedDx>>);
  const int warpgroup = warpgroup_role();

  const BackwardPipeline<Gemms> pipe(smem.mainloop.full, smem.mainloop.empty);
  start_persistent_cta(
      [&] {
        pipe.init();
        cute::prefetch_tma_descriptor(&p.dgrad_mainloop.a);
        cute::prefetch_tma_descriptor(&p.dgrad_mainloop.b);
        cute::prefetch_tma_descriptor(&p.dx_mainloop.a);
        cute::prefetch_tma_descriptor(&p.dx_mainloop.b);
        if (p.tiles.has_shared) {
          cute::prefetch_tma_descriptor(&p.shared_dgrad_mainloop.a);
          cute::prefetch_tma_descriptor(&p.shared_dgrad_mainloop.b);
          cute::prefetch_tma_descriptor(&p.shared_dx_mainloop.a);
          cute::prefetch_tma_descriptor(&p.shared_dx_mainloop.b);
        }
      },
      [] { __syncthreads(); });

  if (warpgroup == 0) {
    run_producer_warpgroup<Gemms::kRegisterSplit.producer>([&] {
      const int warp = static_cast<int>(threadIdx.x) / 32;
      if (threadIdx.x == 0) {
        produce_backward_tiles(world, place, p, smem.mainloop, pipe);
      } else if (warp > 0) {
        idle_work(warp - 1);
      }
    });
  } else {
    run_consumer_warpgroup<typename Gemms::Policy, Mma, Gemms::kRegisterSplit.consumer>(
        smem, warpgroup,
        [&](auto& tiled_mma, const auto& tCrA, const auto& tCrB, const auto& scales, auto& accum,
            ChunkStoreRing& ring, int consumer, int wg_thread) {
          consume_backward_tiles(world, p, tiled_mma, tCrA, tCrB, scales, accum, pipe, ring, consumer, wg_thread);
        });
  }
}

}  // namespace caracal::fused
