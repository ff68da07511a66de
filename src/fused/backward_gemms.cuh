#pragma once
// The fused backward's GEMMs in one precision, the one seam between a bf16 and an FP8 backward
// (backward_params.cuh, backward_compute.cuh, backward_pull.cuh, backward_local_rows.cuh,
// dx_group_sums.cuh and backward_launch.cuh take it as `Gemms`), as forward_gemms.cuh is the forward's:
//   Dgrad            the dgrad+SwiGLU tiles, the routed and the shared expert's
//   Dx               the routed experts' dx tiles, each row stored into its home slot
//                    (gemm::HomeSlotsEpilogue, or summed per (token, rank) first: dx_group_sums.cuh)
//   SharedDx         the shared expert's dx tiles, its rows stored as they are
//                    (all three the standalone kernels' GEMMs, hence the same bits; one policy, so
//                    that they share the CTA's stage ring and storage)
//   Pull             where the dy rows and their g are, at home and in the ring
//   kRowsInLaunch    whether the launch moves dy rows: the comm role pulls other GPUs' into the
//                    ring (Pull's form), the idle warps copy this GPU's and sum dx groups; without,
//                    every dy row is in the ring before the launch and the comm role only counts them
//   kMaxLocalRanks   the local ranks whose GEMM descriptors the kernel's parameters (32 KiB) hold
//   kRegisterSplit   the setmaxnreg budgets: (producer + 2 x consumers) x 128 <= 64 K registers
//   apply_dgrad_epilogue
//                    a consumer warpgroup's dgrad epilogue over its slice of a tile
#include <type_traits>

#include "device/gemm/block_scaled_mainloop.cuh"
#include "device/gemm/chunk_store.cuh"
#include "device/gemm/expert_gemms/down_dgrad_swiglu.cuh"
#include "device/gemm/expert_gemms/down_dgrad_swiglu_fp8.cuh"
#include "device/gemm/expert_gemms/gate_up_dgrad.cuh"
#include "device/gemm/expert_gemms/gate_up_dgrad_fp8.cuh"
#include "device/gemm/expert_gemms/gate_up_dgrad_to_home.cuh"
#include "device/gemm/expert_gemms/gate_up_dgrad_to_home_fp8.cuh"
#include "device/gemm/gemm_config.cuh"
#include "device/gemm/mainloop.cuh"
#include "device/gemm/tile_coord.cuh"
#include "device/transfer/pull_fp8_rows.cuh"
#include "device/transfer/pull_rows.cuh"
#include "fused/fused_forward.hpp"

namespace caracal::fused {

struct Bf16BackwardGemms {
  using Dgrad = gemm::DownDgradSwigluGemm;
  using Dx = gemm::GateUpDgradToHomeGemm;
  using SharedDx = gemm::GateUpDgradGemm;
  using Policy = Dgrad::Policy;
  using Pull = transfer::PullRows;
  static constexpr bool kRowsInLaunch = true;
  static constexpr int kMaxLocalRanks = kFusedMaxLocalRanks;
  // The producer thread takes tasks, waits on counters and prefetches the dgrad epilogue's gate/up
  // (ptxas spilled it at 56 registers; the standalone dgrad's producer has 48), its warpgroup's
  // other warps copy rows and sum dx groups: 72 x 128 + 216 x 256 = 64512, the 168 x 384 the CTA is
  // launched with.
  static constexpr gemm::RegisterSplit kRegisterSplit{72, 216};

  // Its gate/up pairs loaded in place: these consumers' 216 registers leave no room to load ahead.
  template <class Accum>
  __device__ static void apply_dgrad_epilogue(const Dgrad::Epilogue::Params& p, const gemm::TileCoord& tile,
                                              const Accum& accum, bool active, gemm::ChunkStoreRing& ring,
                                              int consumer) {
    Dgrad::Epilogue::apply</*kLoadAhead=*/false>(p, tile, accum, active, ring, consumer);
  }
};

// DeepSeek-V3's recipe (issue 47): dy in e4m3 rows with 1 x 128 scales, the weights' transposed
// e4m3 copies with 128 x 128 scales, d_gate_up stored in e4m3 by the dgrad epilogue for dx; all in
// 128 x 128 x 128 tiles (the standalone dgrad's where D < 4096; in 128 x 256 tiles, the standalone
// dx's, the consumers spill at any split of the launch's registers). The exchange's FP8 rows have no
// ring: one window over the whole schedule, its dy rows and g pulled before the launch
// (TokenExchange::reverse_combine_fp8), its dx rows stored per route.
struct Fp8BackwardGemms {
  using Dgrad = gemm::Fp8DownDgradSwigluGemm;
  using Dx = gemm::Fp8GateUpDgradNarrowToHomeGemm;
  using SharedDx = gemm::Fp8GateUpDgradNarrowGemm;
  using Policy = Dgrad::Policy;
  using Pull = transfer::PullFp8Rows;
  static constexpr bool kRowsInLaunch = false;
  // Four maps more a group of experts (the operands' scales), as the fused FP8 forward's.
  static constexpr int kMaxLocalRanks = kFusedFp8MaxLocalRanks;
  // The producer thread takes tasks, waits on counters and loads (ptxas spills it at 56 registers);
  // the consumers' narrow tiles hold 128 accumulators: 72 x 128 + 216 x 256 = 64512.
  static constexpr gemm::RegisterSplit kRegisterSplit{72, 216};

  template <class Accum>
  __device__ static void apply_dgrad_epilogue(const Dgrad::Epilogue::Params& p, const gemm::TileCoord& tile,
                                              const Accum& accum, bool active, gemm::ChunkStoreRing& ring,
                                              int consumer) {
    Dgrad::Epilogue::apply(p, tile, accum, active, ring, consumer);
  }
};

// A backward's GEMMs share the CTA's stage ring and their stages' layout; the producer loads each
// task's operands as its GEMM does, and the consumers' wgmmas serve all three alike.
template <class Gemms>
inline constexpr bool kBackwardGemmsShareRing =
    std::is_same_v<typename Gemms::Dgrad::Policy, typename Gemms::Dx::Policy> &&
    std::is_same_v<typename Gemms::Dx::Policy, typename Gemms::SharedDx::Policy> &&
    Gemms::Dgrad::OperandA::kMajor == Gemms::Dx::OperandA::kMajor &&
    Gemms::Dgrad::OperandB::kMajor == Gemms::Dx::OperandB::kMajor &&
    std::is_same_v<typename Gemms::Dx::OperandA, typename Gemms::SharedDx::OperandA> &&
    std::is_same_v<typename Gemms::Dx::OperandB, typename Gemms::SharedDx::OperandB>;
static_assert(kBackwardGemmsShareRing<Bf16BackwardGemms> && kBackwardGemmsShareRing<Fp8BackwardGemms>,
              "the dgrad and dx tiles share the stages' layout and the CTA's storage");
static_assert(gemm::fits_launch_registers(Bf16BackwardGemms::kRegisterSplit) &&
                  gemm::fits_launch_registers(Fp8BackwardGemms::kRegisterSplit),
              "the fused backward's setmaxnreg budgets fit the launch's registers");

}  // namespace caracal::fused
