#pragma once
// The fused backward over one window of the ring (DESIGN §3; docs/ARCHITECTURE.md "The fused
// backward"): one persistent launch a window per GPU that pulls the window's dy rows of other GPUs'
// tokens with their g, runs the shared expert's (window 0) and the routed experts' dgrad+SwiGLU and
// dx tiles from one task counter (dx rows into their home slots, or summed per (token, rank) on the
// idle warps where groups_dx_rows), a block's tiles starting once its rows are in (readiness
// counters); the router-score reduction follows, the weight gradients are the caller's. Before it:
// reverse_combine over the window (padding zeroed or local rows copied). Output: the same bits as
// reverse_combine, grouped_down_dgrad_swiglu and gate_up_dgrad_to_home (dx grouped: one more bf16
// rounding a group), whatever comm_ctas.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "caracal/comm/world.hpp"
#include "caracal/gemm/expert_pass.hpp"
#include "caracal/gemm/expert_pass_fp8.hpp"
#include "caracal/transfer/token_exchange.hpp"

namespace caracal::fused {

struct FusedBackwardRank {
  // rows = the exchange's schedule view with the window [first_row, end_row) set (its ring's
  // buffer rows from 0); dy and gates: the exchange's expert_dy and expert_gates (the launch pulls
  // them); gate_up (read), d_gate_up, activation (g·activation out), dg, workspace as
  // gemm::dgrad_gemm_args reads them.
  gemm::ExpertPass pass;
  gemm::ExpertPassWeights weights;
  // backward_ready_counter_words(pass.rows.buffer_rows(), shared rows or 0) device words (zeroed
  // by the launcher).
  uint32_t* ready_counters = nullptr;
  // The shared expert's dgrad+SwiGLU and dx tiles in the same launch, before the routed ones (they
  // need no pulled rows): `shared` as gemm::dgrad_gemm_args and dx_gemm_args read it (its dg
  // partials reduced into shared.dg after the launch), but its dx rows stored into shared.dx's
  // first shared_dx_rows rows only (the rows past them, padding, are not stored: shared.dx may be a
  // buffer of the tokens' rows). shared.dx must not be shared.x: its weight gradients, the
  // caller's after the launch (gemm::expert_weight_grads, as the routed experts'), read x.
  bool has_shared = false;
  gemm::ExpertPass shared;
  gemm::ExpertPassWeights shared_weights;
  int shared_dx_rows = 0;
};

struct FusedBackwardArgs {
  const transfer::TokenExchange* exchange = nullptr;
  std::vector<FusedBackwardRank> ranks;  // one per local rank of the exchange's world, one window
  // Also pull the window's x rows into expert_x (TokenExchange::dispatch's), but those in place.
  bool pull_x = false;
  transfer::RowsInPlace x_in_place = transfer::RowsInPlace::kNone;
  int comm_ctas = 0;  // CTAs per rank that pull first; 0 = default_backward_comm_ctas
  // The reverse combine before the launch leaves it every real dy row (RowsInPlace::kAll). Those
  // of tokens on this GPU (and with pull_x their x rows) are copied by every CTA but the comm CTAs:
  // the first blocks' dy by all warps before the tiles, the rest by the idle warps under them
  // (src/fused/backward_local_rows.cuh); with pull_all_rows the comm CTAs pull them as other GPUs'
  // (the same bits): for tests, so that one GPU runs the pull role.
  bool pull_all_rows = false;
};

// The fused backward in FP8 (DeepSeek-V3's recipe: fused/backward_gemms.cuh's Fp8BackwardGemms) over
// the whole schedule: the exchange's FP8 rows have no ring. Its dy rows and g are all in the
// exchange's expert_dy codes, scales and expert_gates before the launch
// (TokenExchange::reverse_combine_fp8), which pulls none. Output: the same bits as
// gemm::grouped_down_dgrad_swiglu and gemm::grouped_gate_up_dgrad in FP8 with each dx row stored into
// its route's home slot (DxSlots::kPerRoute: TokenExchange::reverse_dispatch_filled_dx_slots sums
// them), whatever comm_ctas; but dg where D >= 4096 (gemm::fp8_dgrad_wide_tiles): there the
// standalone dgrad sums each row's dL/dg partials over 256 columns, this launch's tiles over 128.
struct FusedBackwardFp8Rank {
  // rows = the exchange's schedule view of the rank (no ring; first_row and end_row 0: every row);
  // dy_fp8 and gates: the exchange's expert_dy codes and scales and expert_gates; gate_up,
  // d_gate_up (bf16) and d_gate_up_fp8, activation (g·activation out), dg, workspace
  // (gemm::fp8_down_dgrad_workspace_floats) as gemm::dgrad_gemm_args reads them; dx is not written.
  gemm::Fp8ExpertPass pass;
  gemm::Fp8ExpertWeights weights;
  // backward_fp8_ready_counter_words(pass.rows.row_capacity, shared rows or 0) device words (zeroed
  // by the launcher).
  uint32_t* ready_counters = nullptr;
  // The shared expert's dgrad+SwiGLU and dx tiles first, as FusedBackwardRank's: `shared` as
  // gemm::dgrad_gemm_args and dx_gemm_args read it, its dy_fp8 quantized before the launch, its dx
  // rows stored into shared.dx's first shared_dx_rows rows only (shared.dx must not be shared.x:
  // its weight gradients read x after the launch).
  bool has_shared = false;
  gemm::Fp8ExpertPass shared;
  gemm::Fp8ExpertWeights shared_weights;
  int shared_dx_rows = 0;
};

struct FusedBackwardFp8Args {
  const transfer::TokenExchange* exchange = nullptr;  // with ExchangeOptions::fp8_reverse_combine
  std::vector<FusedBackwardFp8Rank> ranks;  // one per local rank, at most kFusedFp8MaxLocalRanks
  int comm_ctas = 0;  // CTAs per rank that count the rows first; 0 = one
};

// Device words a rank needs for a window of `buffer_rows` rows (and `shared_rows` rows of the
// shared expert, 0 without): its readiness counters and the CTAs' task slots; 32-byte aligned.
size_t backward_ready_counter_words(int buffer_rows, int shared_rows);

// Whether the launch over `exchange` sums the dx rows per (token, rank) before they go home (see
// above): a ring of expert_dx rows, more than one rank, and not ExchangeOptions::rows_per_route.
bool groups_dx_rows(const transfer::TokenExchange& exchange);

// CTAs per rank of the launch on `world`'s device (one per SM, shared by the local ranks).
int fused_backward_ctas_per_rank(const comm::World& world);
// The comm CTAs per rank used when FusedBackwardArgs::comm_ctas is 0: 1 where the idle warps copy
// the local rows and every rank is on this GPU (nothing to pull), else a sixteenth of the CTAs.
int default_backward_comm_ctas(const comm::World& world, bool local_rows_in_launch);

// The same for the FP8 launch over `row_capacity` rows.
size_t backward_fp8_ready_counter_words(int row_capacity, int shared_rows);

// CTAs per rank of the FP8 launch.
int fused_backward_fp8_ctas_per_rank(const comm::World& world);

// Enqueues on `stream`: the counters zeroed, the launch, the router-score reductions. Throws
// caracal::Error for a world of more than kFusedMaxLocalRanks local ranks, comm_ctas outside
// [1, CTAs per rank - 1], or arguments the GEMMs refuse.
void fused_backward(comm::World& world, const FusedBackwardArgs& args, cudaStream_t stream);
// The same in FP8. Throws caracal::Error for a world of more than kFusedFp8MaxLocalRanks local
// ranks, an exchange without fp8_reverse_combine, comm_ctas outside [1, CTAs per rank - 1], or
// arguments the GEMMs refuse.
void fused_backward(comm::World& world, const FusedBackwardFp8Args& args, cudaStream_t stream);

}  // namespace caracal::fused
