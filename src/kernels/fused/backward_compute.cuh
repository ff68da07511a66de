#pragma once
// The fused backward's compute role: the grouped-GEMM CTA of grouped_gemm_kernel.cuh (warpgroup 0
// produces, warpgroups 1 and 2 run wgmma and the epilogue) running the rank's tasks
// (backward_tasks.cuh) as it takes them from the rank's task counter. A dgrad tile's dy rows are
// gathered where they are (gathered_rows.cuh, as the fused forward's up/gate rows): tokens on this
// GPU from their home dy, tokens of other GPUs from expert_dy once the comm role has pulled them
// (dy_ready counts a block's pulled rows); its W_down by TMA, and its epilogue's g once the comm role
// has stored the window's (gates_ready). A dx tile loads d_gate_up and W_gate_up by TMA once its
// block's dgrad tiles have stored d_gate_up (dgrad_done, raised below by their epilogues after the
// TMA stores completed). The producer hands each tile's task to the consumers through the CTA's
// task slot of the tile's first stage, as the fused forward's (forward_compute.cuh);
// BackwardPhase::end there ends the consumers' walk: when the tasks run out, and when a wait fails
// (timeout or aborted world, recorded for World::check; the layer poisons the outputs of such a
// pass).
#include <cstdint>

#include <cute/tensor.hpp>
#include <cutlass/arch/reg_reconfig.h>

#include "device/comm/cta_place.cuh"
#include "device/comm/device_world.cuh"
#include "device/comm/ready_flags.cuh"
#include "device/gemm/chunk_store.cuh"
#include "device/gemm/gathered_rows.cuh"
#include "device/gemm/gemm_config.cuh"
#include "device/gemm/grouped_gemm_kernel.cuh"
#include "device/gemm/mainloop.cuh"
#include "device/gemm/mma_config.cuh"
#include "device/gemm/tma_pipeline.cuh"
#include "kernels/fused/backward_params.cuh"
#include "kernels/fused/backward_pull.cuh"
#include "kernels/fused/backward_tasks.cuh"
#include "kernels/fused/task_slots.cuh"

namespace caracal::fused {

// setmaxnreg budgets: the producer warpgroup takes tasks, waits on counters, gathers rows and
// prefetches the dgrad epilogue's gate/up; the consumers hold the dgrad epilogue (ptxas spilled
// them at 208, the fused forward's split); 72 x 128 + 216 x 256 = 64512, the 168 x 384 the CTA is
// launched with.
inline constexpr uint32_t kBackwardProducerRegisters = 72;
inline constexpr uint32_t kBackwardConsumerRegisters = 216;

// Where row `i` of a dgrad tile's dy comes from: a token's home dy row where the comm role does not
// pull it for the tile (backward_pull.cuh: dy_read_from_ring), else its ring row (`pulled` set); a
// padding row nowhere (nullptr: zero-filled).
__device__ inline const __nv_bfloat16* dy_source(const comm::DeviceWorld& world, const BackwardKernelParams& kp,
                                                 int rank, const ScheduleView& schedule, const gemm::TileCoord& tile,
                                                 int i, bool& pulled) {
  const int row = tile.m_begin + i;
  const int2 entry = schedule.rows[row];
  pulled = false;
  if (entry.x < 0) return nullptr;
  const transfer::PullRows& pull = kp.dy_pull;
  if (!dy_read_from_ring(world, entry, kp.pull_all_rows)) {
    return world.at(pull.home_rows, entry.x) + static_cast<int64_t>(entry.y / pull.top_k) * pull.hidden;
  }
  pulled = true;
  return world.at(pull.expert_rows, rank) + static_cast<int64_t>(schedule.buffer_row(row)) * pull.hidden;
}

// The producer warpgroup (`thread` in [0, 128)): thread 0 takes tasks and waits for what each one
// reads; then all stream its operands: a dgrad tile's A gathered by every thread and B by TMA from
// thread 0 (with the epilogue's gate/up prefetch), a dx tile's A and B by TMA from thread 0. Every
// stage's fill completes on 1 + kGatherArrivals arrivals (run_backward_tasks): thread 0's
// arrive_and_expect_tx and one per thread, after its gathering copies landed (dgrad) or at once.
__device__ inline void produce_backward_tiles(const comm::DeviceWorld& world, const comm::CtaPlace& place,
                                              const FusedBackwardRankParams& p, const BackwardKernelParams& kp,
                                              gemm::MainloopStorage& smem, int& shared_task,
                                              const gemm::TmaPipeline& pipe, int thread) {
  BackwardTaskCursor tasks(p.tiles);
  gemm::PipelineState st;
  bool gates_stored = false;  // thread 0's: gates_ready seen complete
  for (;;) {
    if (thread == 0) shared_task = static_cast<int>(atomicAdd(p.task_counter, 1u));
    gemm::gather_threads_sync();
    const int t = shared_task;
    // Meets every thread before thread 0 writes the next task.
    if (gemm::gather_threads_count(t >= tasks.num_tasks()) > 0) break;
    const BackwardTask task = tasks.at(t);
    const int block = task.buffer_block();
    const bool dgrad = task.phase == BackwardPhase::dgrad;
    gemm::GatherRows rows;
    bool pulled = false;
    if (dgrad) {
      const ScheduleView& schedule = p.tiles.dgrad.schedule;
      (void)dy_source(world, kp, place.rank, schedule, task.tile, thread, pulled);  // row `thread`: counted
      for (int j = 0; j < gemm::kGatherRowsPerThread; ++j) {
        bool unused;
        rows.src[j] = dy_source(world, kp, place.rank, schedule, task.tile, gemm::gather_row(thread, j), unused);
      }
    }
    // What the tile waits for: a dgrad tile for its block's pulled rows (if any) and the window's g,
    // a dx tile for its block's d_gate_up.
    const int pulled_rows = dgrad ? gemm::gather_threads_count(pulled) : 0;
    bool ready = true;
    if (thread == 0) {
      if (dgrad) {
        if (!gates_stored) {
          ready = gates_stored = comm::wait_ready_thread(world, place, p.gates_ready,
                                                         static_cast<uint32_t>(kp.comm_ctas), -1);
        }
        if (ready && pulled_rows > 0) ready = comm::wait_ready_thread(world, place, p.dy_ready + block, pulled_rows, block);
      } else {
        ready = comm::wait_ready_thread(world, place, p.dgrad_done + block,
                                        2u * static_cast<uint32_t>(p.tiles.dgrad.n_blocks), block);
      }
      comm::async_proxy_fence();  // what the counter guards was published through the generic proxy
    }
    if (!gemm::gather_threads_all(ready)) break;  // after thread 0's acquire
    const gemm::MainloopParams& mainloop = dgrad ? p.dgrad_mainloop : p.dx_mainloop;
    const int prefetch_at = dgrad ? max(task.tile.k_tiles - gemm::kSourcePrefetchLead, 0) : -1;
    for (int k = 0; k < task.tile.k_tiles; ++k) {
      pipe.producer_acquire(st);  // the stage's last use (and, at k = 0, the slot's last task) has been read
      if (thread == 0 && k == 0) p.task_slots[first_task_slot(world) + st.stage].task = task;
      const int k_index = task.tile.k_begin + k * gemm::kBlockK;
      if (dgrad) {
        // Zero-filling copies name the schedule (any valid address: they read nothing).
        gemm::gather_k_tile(rows, reinterpret_cast<const __nv_bfloat16*>(p.tiles.dgrad.schedule.rows), k_index,
                            smem.a[st.stage], &smem.full[st.stage], thread);
        if (thread == 0) {
          if (k == prefetch_at) DgradGemm::Epilogue::prefetch_source(p.dgrad_epilogue, task.tile);
          uint64_t* full = pipe.producer_expect(st, gemm::kBlockN * gemm::kBlockK * sizeof(gemm::Element));
          DgradGemm::OperandB::load<gemm::kBlockN>(&mainloop.b, full, smem.b[st.stage], task.tile.n_begin,
                                                   mainloop.b_mn_extent, k_index, task.tile.expert);
        }
      } else {
        if (thread == 0) {
          uint64_t* full = pipe.producer_expect(st, gemm::kStageBytes);
          DxGemm::OperandA::load<gemm::kBlockM>(&mainloop.a, full, smem.a[st.stage], task.tile.m_buffer,
                                                mainloop.a_mn_extent, k_index, task.tile.expert);
          DxGemm::OperandB::load<gemm::kBlockN>(&mainloop.b, full, smem.b[st.stage], task.tile.n_begin,
                                                mainloop.b_mn_extent, k_index, task.tile.expert);
        }
        cutlass::arch::ClusterBarrier::arrive(&smem.full[st.stage]);
      }
      st.advance();
    }
  }
  pipe.producer_acquire(st);
  if (thread == 0) {
    p.task_slots[first_task_slot(world) + st.stage].task.phase = BackwardPhase::end;
    cutlass::arch::ClusterBarrier::arrive(&smem.full[st.stage]);
  }
  cutlass::arch::ClusterBarrier::arrive(&smem.full[st.stage]);
}

// A consumer warpgroup: wgmma over each task's stages, then the task's epilogue. After a dgrad
// tile the warpgroup's leader (the thread that issued its TMA stores) waits for the stores to
// complete and raises the block's dgrad_done.
template <class TiledMma, class FragA, class FragB, class Accum>
__device__ void consume_backward_tiles(const comm::DeviceWorld& world, const FusedBackwardRankParams& p,
                                       TiledMma& tiled_mma, const FragA& tCrA, const FragB& tCrB, Accum& accum,
                                       const gemm::TmaPipeline& pipe, gemm::ChunkStoreRing& ring, int consumer,
                                       int wg_thread) {
  const int lane = wg_thread % 32;
  gemm::PipelineState st;
  for (;;) {
    pipe.consumer_wait(st);  // the tile's first stage, and with it its task
    const BackwardTask task = p.task_slots[first_task_slot(world) + st.stage].task;
    if (task.phase == BackwardPhase::end) break;
    const bool active = task.tile.m_begin + consumer * gemm::kWarpgroupRows < task.tile.active_end;
    gemm::mma_tile(tiled_mma, tCrA, tCrB, accum, pipe, st, task.tile.k_tiles, active, lane,
                   /*gathered=*/task.phase == BackwardPhase::dgrad);
    if (task.phase == BackwardPhase::dgrad) {
      DgradGemm::Epilogue::apply(p.dgrad_epilogue, task.tile, accum, active, ring, consumer);
      ring.drain();  // this warpgroup's stores of the slice have completed
      if (wg_thread == 0) {
        comm::async_proxy_fence();
        comm::signal_ready_thread(p.dgrad_done + task.buffer_block());
      }
    } else {
      DxGemm::Epilogue::apply(p.dx_epilogue, task.tile, accum, active, ring, consumer);
    }
  }
  ring.drain();
}

// One compute CTA (all kThreads threads).
__device__ inline void run_backward_tasks(const comm::DeviceWorld& world, const comm::CtaPlace& place,
                                          const FusedBackwardRankParams& p, const BackwardKernelParams& kp,
                                          gemm::KernelStorage& smem, int& producer_task) {
  using namespace cute;
  using namespace gemm;
  using Mma = MmaConfig<DgradGemm::OperandA::kMajor, DgradGemm::OperandB::kMajor>;
  const int warpgroup = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / kWarpgroupThreads, 0);

  const TmaPipeline pipe(smem.mainloop.full, smem.mainloop.empty);
  if (threadIdx.x == 0) {
    pipe.init(1 + gemm::kGatherArrivals);  // every producer thread arrives too (produce_backward_tiles)
    prefetch_tma_descriptor(&p.dgrad_mainloop.b);
    prefetch_tma_descriptor(&p.dx_mainloop.a);
    prefetch_tma_descriptor(&p.dx_mainloop.b);
  }
  __syncthreads();

  if (warpgroup == 0) {
    cutlass::arch::warpgroup_reg_dealloc<kBackwardProducerRegisters>();
    produce_backward_tiles(world, place, p, kp, smem.mainloop, producer_task, pipe, static_cast<int>(threadIdx.x));
    return;
  }
  cutlass::arch::warpgroup_reg_alloc<kBackwardConsumerRegisters>();
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
  consume_backward_tiles(world, p, tiled_mma, tCrA, tCrB, accum, pipe, ring, consumer, wg_thread);
}

}  // namespace caracal::fused
