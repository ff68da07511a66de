#pragma once
// What the fused forward kernel reads: per local rank the two grouped GEMMs (up/gate+SwiGLU, down)
// of its routed experts and of its shared expert in the forward's precision (`Gemms`,
// forward_gemms.cuh), and its readiness counters; the exchange's schedule and pull buffers for all
// ranks. Passed as a __grid_constant__ so the TMA descriptors stay in parameter space.
#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>

#include "caracal/comm/symmetric_ptr.hpp"
#include "device/gemm/mainloop.cuh"
#include "device/gemm/row_tile_scheduler.cuh"
#include "device/transfer/device_params.hpp"
#include "fused/forward_gemms.cuh"
#include "fused/fused_launch.hpp"
#include "fused/forward_task_handoff.cuh"
#include "fused/forward_tasks.cuh"

namespace caracal::fused {

// The routed experts' y rows go to the ring rows of their output buffer (the group sums push them
// home, forward_group_sums.cuh), the shared expert's to its output rows.

// One group of experts' two GEMMs (the routed experts over the schedule's rows, or the shared
// expert over the rank's tokens), but the down GEMM's epilogue. The row buffers' TMA maps span the
// rows they hold (the ring's, for the routed experts): a tile loads and stores at the buffer row
// of its first schedule row (tiles.up.schedule.buffer_row).
template <class Gemms>
struct ExpertGemms {
  using MainloopParams = typename gemm::Mainloop<typename Gemms::Policy>::Params;
  MainloopParams up_mainloop;  // the routed experts' A is gathered (no map of it)
  typename Gemms::UpGate::Epilogue::Params up_epilogue;
  MainloopParams down_mainloop;
  ExpertTiles tiles;
  // Zeroed before the launch, one word per 128-row block: the up/gate tiles' warpgroup slices
  // stored (2 * tiles.up.n_blocks: the block's activation is complete).
  uint32_t* activation_ready;
};

template <class Gemms>
struct FusedForwardRankParams {
  using OutParams = typename Gemms::Down::Epilogue::Params;
  ExpertGemms<Gemms> routed;
  OutParams routed_out;  // into out_rows' ring rows
  const __nv_bfloat16* out_rows;  // the routed rows' outputs, [ring rows][D], as routed_out
  // Zeroed before the launch, one word per 128-row block of the schedule: the down tiles' warpgroup
  // slices whose mainloop is done (2 * tiles.down.n_blocks: the block's ring rows may be reused).
  uint32_t* down_done;
  // Likewise, the down tiles' warpgroup slices whose output rows are stored (2 * tiles.down.n_blocks:
  // the group sums may read them).
  uint32_t* out_stored;
  // Zeroed before the launch, one word per macrobatch: its group_sums tasks done (all of them: the
  // next macrobatch's down tiles may overwrite its output rows).
  uint32_t* sums_done;
  ExpertGemms<Gemms> shared;  // only with has_shared
  OutParams shared_out;
  bool has_shared;
  // Zeroed before the launch: per 128-row block of the schedule, its rows pulled from other GPUs.
  uint32_t* x_ready;
  uint32_t* task_counter;  // the rank's next task (forward_tasks.cuh)
  TaskSlot* task_slots;    // [CTAs of the rank][Gemms::Policy::kStages] (forward_tasks.cuh)
  ProducerScratch* producer_scratch;  // [CTAs of the rank], after the task slots
  const ForwardTask* task_table;      // the routed tasks, after the scratch (forward_task_table.cuh)
};

// A rank's readiness counters, named spans of its ready_counters (FusedForwardRank), zeroed before
// each launch: per 128-row block of the schedule x_ready, the routed activation_ready, down_done
// and out_stored; sums_done per macrobatch (at most one a block); the shared expert's
// activation_ready per block of its rows; the task counter. The rank's task slots follow them
// (RankWords, fused_launch.hpp). Host code: with a null base only `words` is set.
struct ForwardCounters {
  uint32_t* x_ready;
  uint32_t* activation_ready;
  uint32_t* down_done;
  uint32_t* out_stored;
  uint32_t* sums_done;
  uint32_t* shared_activation_ready;
  uint32_t* task_counter;
  size_t words;  // all of the above

  ForwardCounters(uint32_t* base, int row_capacity, int shared_rows) {
    CounterArena arena(base);
    const size_t blocks = size_t(row_capacity > 0 ? row_capacity : 0) / gemm::kBlockM;
    x_ready = arena.take(blocks);
    activation_ready = arena.take(blocks);
    down_done = arena.take(blocks);
    out_stored = arena.take(blocks);
    sums_done = arena.take(blocks);
    shared_activation_ready = arena.take(size_t(shared_rows > 0 ? shared_rows : 0) / gemm::kBlockM);
    task_counter = arena.take(1);
    words = arena.words();
  }
};


// What the group sums read at the home ranks and where they store (forward_group_sums.cuh).
struct GroupSumParams {
  comm::SymmetricPtr<__nv_bfloat16> home_slots;  // combine_slots [T*k][D]
  comm::SymmetricPtr<float> topk_scores;         // [T*k]: g from the scores (router_math.cuh)
  transfer::RouterScaling scaling;
};

template <class Gemms>
struct ForwardKernelParams {
  FusedForwardRankParams<Gemms> ranks[Gemms::kMaxLocalRanks];
  transfer::ScheduleParams schedule;
  typename Gemms::Pull pull;  // home x rows into the ring's expert_x rows (no gates)
  GroupSumParams sums;
  int comm_ctas;            // the first comm_ctas CTAs of every rank pull, then compute too
  bool pull_all_rows;       // pull the rows of tokens on this GPU too (FusedForwardArgs::pull_all_rows)
  bool zero_padding_rows;   // write the ring's padding rows too (FusedForwardFp8Args::pull_all_rows)
  bool rows_per_route;      // ExchangeOptions::rows_per_route
  // Last, so that an empty one (bf16's) takes only the tail's padding.
  typename Gemms::RowBases row_bases;  // the gathered rows' bases, resolved per local rank (forward_gemms.cuh)
};
static_assert(sizeof(ForwardKernelParams<Bf16ForwardGemms>) <= 32764 &&
                  sizeof(ForwardKernelParams<Fp8ForwardGemms>) <= 32764,
              "kernel parameters are limited to 32,764 bytes");

}  // namespace caracal::fused
