#pragma once
// What the fused forward kernel reads: per local rank its two grouped GEMMs (up/gate+SwiGLU, down)
// and its readiness counters, and the exchange's schedule and pull buffers for all ranks. Passed
// as a __grid_constant__ so the TMA descriptors stay in parameter space.
#include <cstdint>

#include "device/gemm/bf16_epilogue.cuh"
#include "device/gemm/mainloop.cuh"
#include "device/gemm/operand_loads.cuh"
#include "device/gemm/row_tile_scheduler.cuh"
#include "device/gemm/swiglu_epilogue.cuh"
#include "device/transfer/device_params.hpp"
#include "device/transfer/pull_rows.cuh"
#include "kernels/fused/forward_tasks.cuh"

namespace caracal::fused {

// gate_up = x · W_gate_up[e]^T with the SwiGLU epilogue; y = activation · W_down[e]^T: the same
// operand kinds and epilogues as the standalone kernels (src/kernels/forward), hence the same bits.
struct UpGateGemm {
  using OperandA = gemm::KMajorRows;
  using OperandB = gemm::KMajorWeights;
  using Epilogue = gemm::UpGateSwigluEpilogue;
};
struct DownGemm {
  using OperandA = gemm::KMajorRows;
  using OperandB = gemm::KMajorWeights;
  using Epilogue = gemm::RowsBf16Epilogue;
};

struct FusedForwardRankParams {
  gemm::MainloopParams up_mainloop;
  UpGateGemm::Epilogue::Params up_epilogue;
  gemm::RowTileScheduler::Params up_tiles;
  gemm::MainloopParams down_mainloop;
  DownGemm::Epilogue::Params down_epilogue;
  gemm::RowTileScheduler::Params down_tiles;
  // Zeroed before the launch, one word per 128-row block of the schedule:
  uint32_t* x_ready;           // rows of the block pulled (kBlockM: all of them, padding included)
  uint32_t* activation_ready;  // up/gate tiles' warpgroup slices stored (2 * up_tiles.n_blocks: all)
  uint32_t* task_counter;      // the rank's next task (forward_tasks.cuh)
  TaskSlot* task_slots;        // [CTAs of the rank][kStages] (forward_tasks.cuh)
};

// Parameter space holds up to 32 KiB: per-rank GEMM descriptors for this many local ranks fit.
inline constexpr int kMaxLocalRanks = 8;

struct ForwardKernelParams {
  FusedForwardRankParams ranks[kMaxLocalRanks];
  transfer::ScheduleParams schedule;
  transfer::PullRows pull;  // home x rows into expert_x rows (no gates)
  int comm_ctas;            // the first comm_ctas CTAs of every rank pull, then compute too
};

}  // namespace caracal::fused
