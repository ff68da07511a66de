#pragma once
// The fused backward over one window of the ring (DESIGN §3; issue 15, first stage): one
// persistent launch per window per GPU (one for all ranks of a loopback world) that pulls the
// window's dy rows of tokens on other GPUs and their g, runs the shared expert's dgrad+SwiGLU and
// dx tiles (window 0, where asked) and the routed experts' dgrad+SwiGLU tiles and their dx tiles,
// whose epilogue stores each row into its home slot (reverse dispatch's
// push, dx_to_home.hpp), and, where asked, copies the window's x rows for the weight gradients —
// the dgrad tiles of a 128-row block starting as soon as all its dy rows are in the ring, the dx
// tiles as soon as the block's d_gate_up is stored (readiness counters, never a host
// synchronization). Comm CTAs (the first comm_ctas of each rank) pull, then join the others, which
// take the rank's tasks from one counter (backward_tasks.cuh). After the launch, on the same
// stream: the router-score gradient's fixed-order reduction; the caller then runs the window's
// weight gradients (gemm::expert_weight_grads), which read x, dy, d_gate_up and g·activation from
// the ring.
//
// Before the launch, on the same stream, TokenExchange::reverse_combine over the window must have
// zeroed the padding rows (in_place = RowsInPlace::kAll with local_rows_in_launch or
// pull_all_rows) or also copied the rows of tokens on this GPU with their g (kOtherGpus). Those
// copies are HBM to HBM: the comm CTAs alone would keep the dgrad tiles waiting on them, so
// local_rows_in_launch spreads them over every CTA, before and under its tiles. It also had the
// pass's world barrier, if any: the launch needs none (its pulls read dy and gates every rank
// published before that barrier; it writes this rank's ring and the home slots, which
// dx_to_home.hpp says when each peer last read).
//
// The dx push per (token, rank) (groups_dx_rows): over an exchange whose expert_dx is a ring, in a
// world of several ranks, the dx tiles leave the rows of tokens on other ranks in that ring, and
// the warps each compute CTA's producer leaves idle sum each token's rows on this rank in the
// window, led by the highest row, and push one row into the leader route's home slot under the
// remaining tiles (src/fused/dx_group_sums.cuh);
// the rows of the rank's own tokens go home from the epilogue. The reverse dispatch after the
// last window then takes DxSlots::kPerTokenRank.
//
// Output: the same bits as TokenExchange::dispatch (x rows, when copied) and reverse_combine of the
// window, gemm::grouped_down_dgrad_swiglu and fused::gate_up_dgrad_to_home over it (dx rows grouped:
// one more bf16 rounding per group of several rows), whatever comm_ctas.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "caracal/comm/world.hpp"
#include "caracal/gemm/expert_pass.hpp"
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
  // Pull every real dy row, those of tokens on this GPU too (the reverse combine before it left them
  // all: RowsInPlace::kAll; the same bits): for tests, so that one GPU runs the pull role.
  bool pull_all_rows = false;
  // The dy rows of tokens on this GPU (and with pull_x their x rows) copied inside the launch by
  // every CTA but the comm CTAs: the first blocks' dy by all warps before the tiles, the rest by
  // the idle warps under them, instead of dy before the launch and x on the comm CTAs (the reverse
  // combine before it then leaves every real row: RowsInPlace::kAll; the same bits;
  // src/fused/backward_local_rows.cuh). Not with pull_all_rows, which pulls them.
  bool local_rows_in_launch = false;
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

// Enqueues on `stream`: the counters zeroed, the launch, the router-score reductions. Throws
// caracal::Error for a world of more than kFusedMaxLocalRanks local ranks, comm_ctas outside
// [1, CTAs per rank - 1], or arguments the GEMMs refuse.
void fused_backward(comm::World& world, const FusedBackwardArgs& args, cudaStream_t stream);

}  // namespace caracal::fused
