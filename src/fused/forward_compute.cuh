#pragma once
// The fused forward's compute role: the persistent task kernel's CTA (persistent_task_kernel.cuh:
// warpgroup 0 produces, warpgroups 1 and 2 run wgmma and the epilogue) running the rank's tasks
// (forward_tasks.cuh: the shared expert's tiles, then the routed experts') as it takes them from
// the rank's task counter, in the precision of `Gemms` (forward_gemms.cuh: bf16, or FP8 with the
// rows' scales beside them). A routed up/gate tile's A rows are gathered where they are
// (gathered_rows.cuh, gathered_fp8_rows.cuh): tokens on this GPU from their home x, tokens of other
// GPUs from expert_x once the comm role has pulled them (x_ready counts a block's pulled rows); the
// shared expert's up/gate A is the rank's x (the exchange's rows, or a zero-padded copy staged
// before the launch where T is not a multiple of 128; in FP8 its codes quantized at home), loaded
// by TMA; a down
// tile's A waits for its block's activation (its group's activation_ready, raised below by the
// up/gate tiles' epilogues once their TMA stores have completed); a routed down tile's output rows
// go to their ring rows of out_rows; a group_sums task is handed to the consumers through a stage
// without bytes, and their eight warps push the block's group sums home (forward_group_sums.cuh)
// while the producer streams the next tiles' operands.
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
#include "device/comm/grid_dependency.cuh"
#include "device/comm/ready_flags.cuh"
#include "device/gemm/chunk_store.cuh"
#include "device/gemm/gathered_rows.cuh"
#include "device/gemm/gemm_config.cuh"
#include "device/gemm/grouped_gemm_kernel.cuh"
#include "device/gemm/mainloop.cuh"
#include "device/gemm/mma_config.cuh"
#include "device/gemm/persistent_task_kernel.cuh"
#include "device/gemm/tma_pipeline.cuh"
#include "fused/forward_gemms.cuh"
#include "fused/forward_group_sums.cuh"
#include "fused/forward_params.cuh"
#include "fused/forward_tasks.cuh"
#include "fused/task_slots.cuh"

namespace caracal::fused {

template <class Gemms>
using ForwardMainloop = gemm::Mainloop<typename Gemms::Policy>;
template <class Gemms>
using ForwardPipeline = gemm::TmaPipeline<Gemms::Policy::kStages>;

// The producer warpgroup (`thread` in [0, 128)): takes tasks as the precision's TaskHandOff hands
// them (forward_task_handoff.cuh; the first routed task waits for the schedule's launch, which the
// shared expert's tiles need not wait for), thread 0 waits for each one's A rows; then all stream
// its operands: a routed up/gate tile's A gathered by every thread
// (gathered_rows.cuh) and B by TMA from thread 0, every other tile's A and B by TMA from thread 0.
// Every stage's fill completes on 1 + kGatherArrivals arrivals (run_forward_tasks): thread 0's
// arrive_and_expect_tx and one per thread, after its gathering copies landed (up/gate) or at once
// (down; and the end sentinel's, where thread 0's extra arrival stands in for the expect).
template <class Gemms>
__device__ void produce_forward_tiles(const comm::DeviceWorld& world, const comm::CtaPlace& place,
                                      const FusedForwardRankParams<Gemms>& p, const ForwardKernelParams<Gemms>& kp,
                                      typename ForwardMainloop<Gemms>::Storage& smem,
                                      const ForwardPipeline<Gemms>& pipe, int thread) {
  using Policy = typename Gemms::Policy;
  using Mainloop = ForwardMainloop<Gemms>;
  const typename Gemms::Sources sources{world, kp.pull, place.rank, kp.pull_all_rows, kp.row_bases};
  typename Gemms::TaskHandOff tasks(p, world, thread);
  typename ForwardPipeline<Gemms>::State st;
  for (;;) {
    ForwardTask task;
    int previous;
    if (!tasks.next(p, world, thread, task, previous)) break;
    const int block = task.m_block();
    if (task.phase == ForwardPhase::group_sums) {  // for the consumers: a stage with the task and no bytes
      pipe.producer_acquire(st);
      if (thread == 0) {
        p.task_slots[first_task_slot<Policy::kStages>(world) + st.stage].task = task;
        cutlass::arch::ClusterBarrier::arrive(&smem.full[st.stage]);
      }
      cutlass::arch::ClusterBarrier::arrive(&smem.full[st.stage]);
      st.advance();
      continue;
    }
    const ExpertGemms<Gemms>& gemms = task.shared() ? p.shared : p.routed;
    const bool gathered = task.phase == ForwardPhase::up_gate;  // the shared expert's A is by TMA
    typename Gemms::GatheredTile rows;
    bool pulled = false;
    if (gathered) rows = Gemms::gather_tile(sources, gemms.tiles.up.schedule, task.tile, thread, pulled);
    // What the tile waits for: a routed up/gate tile for the ring rows it takes over (the down
    // tiles of the block that held them have read them) and its block's pulled rows (if any), a
    // down tile for its block's activation and, routed, for the group sums of the macrobatch whose
    // output rows it takes over; the shared expert's up/gate tiles for nothing.
    const int pulled_rows = gathered ? gemm::gather_threads_count(pulled) : 0;
    if (pulled_rows > 0 || previous >= 0 || !task.up_gate()) {
      bool ready = true;
      if (thread == 0) {
        if (gathered) {
          const uint32_t ring_released = 2u * static_cast<uint32_t>(gemms.tiles.down.n_blocks);
          if (previous >= 0) ready = comm::wait_ready_thread(world, place, p.down_done + previous, ring_released, previous);
          if (ready && pulled_rows > 0) ready = comm::wait_ready_thread(world, place, p.x_ready + block, pulled_rows, block);
        } else {
          const uint32_t activation_complete = 2u * static_cast<uint32_t>(gemms.tiles.up.n_blocks);
          ready = comm::wait_ready_thread(world, place, gemms.activation_ready + block, activation_complete, block);
          if (ready && previous >= 0) {
            const Macrobatches& batches = tasks.macrobatches(p, world);
            const int batch = batches.of_block(previous);
            ready = comm::wait_ready_thread(world, place, p.sums_done + batch,
                                            kGroupSumWarps * static_cast<uint32_t>(batches.blocks_in(batch)), batch);
          }
        }
        comm::async_proxy_fence();  // what the counter guards was published through the generic proxy
      }
      if (!gemm::gather_threads_all(ready)) break;  // after thread 0's acquire
    }
    const typename Mainloop::Params& mainloop = task.up_gate() ? gemms.up_mainloop : gemms.down_mainloop;
    for (int k = 0; k < task.tile.k_tiles; ++k) {
      pipe.producer_acquire(st);  // the stage's last use (and, at k = 0, the slot's last task) has been read
      if (thread == 0 && k == 0) {
        p.task_slots[first_task_slot<Policy::kStages>(world) + st.stage].task = tasks.slot_task(p, world, task);
      }
      const int k_index = task.tile.k_begin + k * Policy::kBlockK;
      if (gathered) {
        // Zero-filling copies name the schedule (any valid address: they read nothing).
        Gemms::gather_stage(sources, rows, gemms.tiles.up.schedule.rows, k_index, smem, st.stage, &smem.full[st.stage],
                            thread);
        if (thread == 0) {
          uint64_t* full = pipe.producer_expect(st, Gemms::kGatheredTmaBytes);
          Mainloop::template load_b<typename Gemms::UpGate>(mainloop, full, smem, st.stage, task.tile.n_begin, k_index,
                                                            task.tile.expert);
        }
      } else {
        if (thread == 0) {
          uint64_t* full = pipe.producer_expect(st, Mainloop::kStageBytes);
          Mainloop::template load_a<typename Gemms::UpGate>(mainloop, full, smem, st.stage, task.tile.m_buffer,
                                                            k_index, task.tile.expert);
          if (task.up_gate()) {  // the shared expert's: its weights as the up/gate reads them
            Mainloop::template load_b<typename Gemms::UpGate>(mainloop, full, smem, st.stage, task.tile.n_begin,
                                                              k_index, task.tile.expert);
          } else {
            Mainloop::template load_b<typename Gemms::Down>(mainloop, full, smem, st.stage, task.tile.n_begin, k_index,
                                                            task.tile.expert);
          }
        }
        cutlass::arch::ClusterBarrier::arrive(&smem.full[st.stage]);
      }
      st.advance();
    }
  }
  pipe.producer_acquire(st);
  if (thread == 0) {
    p.task_slots[first_task_slot<Policy::kStages>(world) + st.stage].task.phase = ForwardPhase::end;
    cutlass::arch::ClusterBarrier::arrive(&smem.full[st.stage]);
  }
  cutlass::arch::ClusterBarrier::arrive(&smem.full[st.stage]);
}

// A consumer warpgroup: wgmma over each task's stages, then the task's epilogue. After an up/gate
// tile the warpgroup's leader (the thread that issued its TMA stores) waits for the stores to
// complete and raises the block's activation_ready; after a routed down tile's wgmmas it raises
// the block's down_done (its ring rows have been read), after its stores the block's out_stored
// where a group_sums task of the launch reads them (not in macrobatch 0).
// A group_sums task takes one stage (no bytes) and each warp's share of the block's groups; each
// warp then raises its macrobatch's sums_done (kGroupSumWarps per block). A wait that fails there
// (recorded: the layer poisons the pass's outputs) still counts, so that nothing waits on it.
template <class Gemms, class TiledMma, class FragA, class FragB, class StageScales, class Accum>
__device__ void consume_forward_tiles(const comm::DeviceWorld& world, const FusedForwardRankParams<Gemms>& p,
                                      const ForwardKernelParams<Gemms>& kp, TiledMma& tiled_mma, const FragA& tCrA,
                                      const FragB& tCrB, const StageScales& scales, Accum& accum,
                                      const ForwardPipeline<Gemms>& pipe, gemm::ChunkStoreRing& ring, int consumer,
                                      int wg_thread) {
  const int lane = wg_thread % 32;
  typename ForwardPipeline<Gemms>::State st;
  for (;;) {
    pipe.consumer_wait(st);  // the tile's first stage, and with it its task
    const ForwardTask task = p.task_slots[first_task_slot<Gemms::Policy::kStages>(world) + st.stage].task;
    if (task.phase == ForwardPhase::end) break;
    const bool sums = task.phase == ForwardPhase::group_sums;  // one stage without bytes, no wgmma
    const bool active = !sums && task.tile.m_begin + consumer * gemm::kWarpgroupRows < task.tile.active_end;
    gemm::mma_tile(tiled_mma, tCrA, tCrB, scales, accum, pipe, st, task.tile.k_tiles, active, lane,
                   /*gathered=*/task.phase == ForwardPhase::up_gate);
    const ExpertGemms<Gemms>& gemms = task.shared() ? p.shared : p.routed;  // after the mainloop: not held across it
    if constexpr (Gemms::kRematerializesRingOffsets) ring.rematerialize_offsets();
    if (sums) {
      if constexpr (Gemms::kSumsGroupsInLaunch) {  // else the launch has one macrobatch: no such task
        const int warp = consumer * (gemm::kWarpgroupThreads / 32) + wg_thread / 32;
        (void)sum_block_groups(world, comm::whole_launch_place(world), p, kp.schedule, kp.sums, kp.pull.hidden,
                               kp.rows_per_route, task.tile, warp, kGroupSumWarps, lane);
        __syncwarp();  // every lane's reads of the output rows before the count
        if (lane == 0) comm::signal_ready_thread(p.sums_done + task.tile.expert);
      }
    } else if (task.up_gate()) {
      // Into the ring.
      Gemms::UpGate::Epilogue::apply(gemms.up_epilogue, task.tile, accum, active, ring, consumer);
      ring.drain();  // this warpgroup's stores of the slice have completed
      if constexpr (Gemms::kUpGateStoresByThreads) ring.plain_stores_issued();
      if (wg_thread == 0) {
        comm::async_proxy_fence();
        comm::signal_ready_thread(gemms.activation_ready + task.m_block());
      }
    } else if (task.shared()) {
      Gemms::Down::Epilogue::apply(p.shared_out, task.tile, accum, active, ring, consumer);
    } else {
      if (wg_thread == 0) comm::signal_ready_thread(p.down_done + task.m_block());  // after its stages' waits
      Gemms::Down::Epilogue::apply(p.routed_out, task.tile, accum, active, ring, consumer);  // into the ring
      // Macrobatch 0's rows wait for the combine launch: their stores need no drain here.
      if (Gemms::kSumsGroupsInLaunch && Macrobatches::summed_in_launch(p.routed.tiles.up.schedule, task.m_block())) {
        ring.drain();  // this warpgroup's stores of the slice have completed
        if (wg_thread == 0) {
          comm::async_proxy_fence();
          comm::signal_ready_thread(p.out_stored + task.m_block());
        }
      }
    }
  }
}

// One compute CTA (all kThreads threads) on the persistent task kernel's prologue and producer
// role; the consumer warpgroups' setup is written out here as in persistent_task_kernel.cuh's
// run_consumer_warpgroup, through which ptxas allocates this kernel's registers differently.
template <class Gemms>
__device__ void run_forward_tasks(const comm::DeviceWorld& world, const comm::CtaPlace& place,
                                  const FusedForwardRankParams<Gemms>& p, const ForwardKernelParams<Gemms>& kp,
                                  gemm::KernelStorage<typename Gemms::Policy>& smem) {
  using namespace cute;
  using namespace gemm;
  using Policy = typename Gemms::Policy;
  using Mma = MmaConfigOf<typename Gemms::UpGate>;
  static_assert(std::is_same_v<Mma, MmaConfigOf<typename Gemms::Down>>);
  const int warpgroup = warpgroup_role();

  const ForwardPipeline<Gemms> pipe(smem.mainloop.full, smem.mainloop.empty);
  start_persistent_cta(
      [&] {
        pipe.init(1 + gemm::kGatherArrivals);  // every producer thread arrives too (produce_forward_tiles)
        prefetch_tma_descriptor(&p.routed.up_mainloop.b);
        prefetch_tma_descriptor(&p.routed.down_mainloop.a);
        prefetch_tma_descriptor(&p.routed.down_mainloop.b);
        if constexpr (Policy::kBlockScaled) {
          prefetch_tma_descriptor(&p.routed.up_mainloop.scales_b);
          prefetch_tma_descriptor(&p.routed.down_mainloop.scales_a);
          prefetch_tma_descriptor(&p.routed.down_mainloop.scales_b);
        }
      },
      [] { __syncthreads(); });

  if (warpgroup == 0) {
    run_producer_warpgroup<Gemms::kProducerRegisters>([&] {
      produce_forward_tiles(world, place, p, kp, smem.mainloop, pipe, static_cast<int>(threadIdx.x));
    });
    return;
  }
  cutlass::arch::warpgroup_reg_alloc<Gemms::kConsumerRegisters>();
  const int consumer = warpgroup - 1;
  const int thread = static_cast<int>(threadIdx.x) - kWarpgroupThreads;
  const int wg_thread = thread % kWarpgroupThreads;
  typename Mma::TiledMma tiled_mma;
  auto thr_mma = tiled_mma.get_thread_slice(thread);
  Tensor sA = make_tensor(make_smem_ptr(&smem.mainloop.a[0][0]), typename Mma::SmemLayoutA{});
  Tensor sB = make_tensor(make_smem_ptr(&smem.mainloop.b[0][0]), typename Mma::SmemLayoutB{});
  Tensor tCrA = thr_mma.make_fragment_A(thr_mma.partition_A(sA));
  Tensor tCrB = thr_mma.make_fragment_B(thr_mma.partition_B(sB));
  const auto scales = ForwardMainloop<Gemms>::stage_scales(smem.mainloop, thread);
  Tensor accum = partition_fragment_C(tiled_mma, Shape<Int<Policy::kBlockM>, Int<Policy::kBlockN>>{});
  static_assert(kTileNOf<decltype(accum)> == Policy::kBlockN, "the accumulators cover the policy's tile");
  ChunkStoreRing ring(smem.epilogue.chunks[consumer], consumer, wg_thread);
  // The rank's parameters found again here: the kernel's index of them, held from its entry, spills.
  consume_forward_tiles(world, kp.ranks[local_rank_of_cta(world)], kp, tiled_mma, tCrA, tCrB, scales, accum, pipe,
                        ring, consumer, wg_thread);
  ring.drain();
}

}  // namespace caracal::fused
