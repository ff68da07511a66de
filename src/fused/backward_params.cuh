#pragma once
// What the fused backward kernel reads: per local rank the two row-tile GEMMs of its routed
// experts over one window of the ring in the backward's precision (`Gemms`, backward_gemms.cuh:
// dgrad+SwiGLU, and dx with its rows stored home), those of
// its shared expert (window 0), and its readiness counters; the exchange's schedule and the pulls of the window's dy rows (with g) and,
// where asked, x rows. Passed as a __grid_constant__ so the TMA descriptors stay in parameter space.
#include <cstdint>

#include "device/gemm/mainloop.cuh"
#include "device/transfer/device_params.hpp"
#include "device/transfer/pull_rows.cuh"
#include "fused/backward_gemms.cuh"
#include "fused/backward_tasks.cuh"
#include "fused/fused_forward.hpp"
#include "fused/fused_launch.hpp"

namespace caracal::fused {

// The GEMMs are the standalone kernels' (backward_gemms.cuh), hence the same bits.
template <class Gemms>
struct FusedBackwardRankParams {
  using MainloopParams = typename gemm::Mainloop<typename Gemms::Policy>::Params;
  MainloopParams dgrad_mainloop;
  typename Gemms::Dgrad::Epilogue::Params dgrad_epilogue;
  MainloopParams dx_mainloop;
  typename Gemms::Dx::Epilogue::Params dx_epilogue;
  // With tiles.has_shared: the shared expert's two GEMMs over its rows.
  MainloopParams shared_dgrad_mainloop;
  typename Gemms::Dgrad::Epilogue::Params shared_dgrad_epilogue;
  MainloopParams shared_dx_mainloop;
  typename Gemms::SharedDx::Epilogue::Params shared_dx_epilogue;
  BackwardTiles tiles;
  // Zeroed before the launch, one word per 128-row block of the window: its rows whose dy is in the
  // ring (kBlockM: all of them, backward_pull.cuh), its dgrad tiles' warpgroup slices whose
  // d_gate_up stores have completed (2 * tiles.dgrad.n_blocks: the dx tiles may read the block),
  // and with tiles.group_dx its dx tiles' warpgroup slices whose rows are stored (dx_group_sums.cuh);
  // with tiles.has_shared one per 128-row block of the shared expert's rows: its dgrad tiles'
  // warpgroup slices whose d_gate_up stores have completed.
  uint32_t* dy_ready;
  uint32_t* dgrad_done;
  uint32_t* dx_done;
  uint32_t* shared_dgrad_done;
  uint32_t* task_counter;        // the rank's next task (backward_tasks.cuh)
  uint32_t* sums_counter;        // with tiles.group_dx: the next rows to sum (dx_group_sums.cuh)
  BackwardTaskSlot* task_slots;  // [CTAs of the rank][Gemms::Policy::kStages]
};

// A rank's readiness counters, named spans of its ready_counters (FusedBackwardRank), zeroed before
// each launch: per 128-row block of the window's buffer rows dy_ready, dgrad_done and dx_done; the
// task counter; the dx sums' counter; the shared expert's dgrad_done per block of its rows. The
// rank's task slots follow them (RankWords, fused_launch.hpp). Host code: with a null base only
// `words` is set.
struct BackwardCounters {
  uint32_t* dy_ready;
  uint32_t* dgrad_done;
  uint32_t* dx_done;
  uint32_t* task_counter;
  uint32_t* sums_counter;
  uint32_t* shared_dgrad_done;
  size_t words;  // all of the above

  BackwardCounters(uint32_t* base, int buffer_rows, int shared_rows) {
    CounterArena arena(base);
    const size_t blocks = size_t(buffer_rows > 0 ? buffer_rows : 0) / gemm::kBlockM;
    dy_ready = arena.take(blocks);
    dgrad_done = arena.take(blocks);
    dx_done = arena.take(blocks);
    task_counter = arena.take(1);
    sums_counter = arena.take(1);
    shared_dgrad_done = arena.take(size_t(shared_rows > 0 ? shared_rows : 0) / gemm::kBlockM);
    words = arena.words();
  }
};

template <class Gemms>
struct BackwardKernelParams {
  FusedBackwardRankParams<Gemms> ranks[Gemms::kMaxLocalRanks];
  transfer::ScheduleParams schedule;
  typename Gemms::Pull dy_pull;  // home dy rows and gates into the ring's expert_dy rows and expert_gates
  transfer::PullRows x_pull;   // home x rows into the ring's expert_x rows
  transfer::PullWindow x_window;  // the window's x rows, but those in place; unused without pull_x
  int comm_ctas;  // the first comm_ctas CTAs of every rank pull, then compute too
  bool pull_x;
  bool pull_all_rows;   // pull every real dy row, those of tokens on this GPU too (FusedBackwardArgs)
  // The other CTAs copy the dy rows of tokens on this GPU (the first blocks' with every warp, the
  // rest on their idle warps), then the x rows where pull_x (unless FusedBackwardArgs::pull_all_rows;
  // backward_local_rows.cuh).
  bool local_rows_in_launch;
  bool rows_per_route;  // ExchangeOptions::rows_per_route
};
static_assert(sizeof(BackwardKernelParams<Bf16BackwardGemms>) <= 32764 &&
                  sizeof(BackwardKernelParams<Fp8BackwardGemms>) <= 32764, "kernel parameters are limited to 32,764 bytes");

}  // namespace caracal::fused
