#pragma once
// The fused forward (DESIGN §3; docs/ARCHITECTURE.md "The fused forward"): one persistent launch a
// pass per GPU that pulls the dispatch rows (comm CTAs), runs the shared and the routed experts'
// GEMMs from one task counter, a block's tiles starting once its rows have landed (readiness
// counters, no host synchronization), and pushes the routed outputs home as g-weighted sums per
// (token, rank, macrobatch), over a ring of pass.rows.ring_rows rows walked from the last
// macrobatch down (0: one macrobatch). The schedule, the gates and macrobatch 0's combine are launches
// around it; it needs no world barrier. Output: the same bits as the separate launches (shared expert,
// dispatch, routed experts, combine with group_rows = ring_rows), whatever comm_ctas.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "caracal/comm/world.hpp"
#include "caracal/gemm/expert_pass.hpp"
#include "caracal/gemm/expert_pass_fp8.hpp"
#include "caracal/transfer/token_exchange.hpp"

namespace caracal::fused {

// The fused kernels' parameters hold every local rank's GEMM descriptors: at most this many (the
// FP8 forward's, with the operands' scale maps: kFusedFp8MaxLocalRanks).
inline constexpr int kFusedMaxLocalRanks = 8;
inline constexpr int kFusedFp8MaxLocalRanks = 4;
// The CTAs of a rank's share of the launch that ready_counter_words leaves task slots for.
inline constexpr int kFusedMaxCtasPerRank = 256;

struct FusedForwardRank {
  // rows = the exchange's schedule view (ring_rows of the launch's choice); x = its expert_x;
  // gate_up, activation; out: the routed rows' outputs (as many rows as the ring, or the row
  // capacity), read back by the group sums, which store into the exchange's combine_slots: it
  // must be the exchange's expert_dy (idle until the backward pulls dy), where
  // TokenExchange::combine_after_fused_forward finds macrobatch 0's.
  gemm::ExpertPass pass;
  gemm::ExpertPassWeights weights;
  // The shared expert (one expert over the rank's tokens: its own rows, x copied in before the
  // launch), run in the same launch ahead of the routed experts; out as gemm::expert_forward.
  bool has_shared = false;
  gemm::ExpertPass shared;
  gemm::ExpertPassWeights shared_weights;
  // ready_counter_words(pass.rows.row_capacity, shared.rows.row_capacity or 0) device words.
  uint32_t* ready_counters = nullptr;
};

struct FusedForwardArgs {
  const transfer::TokenExchange* exchange = nullptr;
  RouterNormalization router;           // g for the group sums: build_schedule's (caracal/layer_config.hpp)
  std::vector<FusedForwardRank> ranks;  // one per local rank of the exchange's world
  int comm_ctas = 0;                    // CTAs per rank that pull first; 0 = default_comm_ctas
  // Pull the rows of tokens on this GPU too, as those of other GPUs (the same bits): for tests and
  // benchmarks, so that one GPU runs the pull role and its ring waits (a loopback world pulls none).
  bool pull_all_rows = false;
};

// The forward in DeepSeek-V3's FP8 recipe (issue 47; gemm::Fp8ExpertPass's GEMMs, hence its bits):
// the same launch with each row of x in e4m3 with its 1 x 128 scales, quantized at home (the
// exchange's x_codes / x_scales, over its home rows), gathered where it is or pulled into the
// ring's expert_x_codes / expert_x_scales, and the activation stored in e4m3 by the up/gate
// epilogue for the down GEMM.
struct FusedForwardFp8Rank {
  // rows as FusedForwardRank's; the ring's rows: gate_up, activation_fp8 and out (the exchange's
  // expert_dy); x_fp8 the exchange's expert_x codes and scales (the ring's, pulled); x, x_tokens
  // and the rest not read.
  gemm::Fp8ExpertPass pass;
  gemm::Fp8ExpertWeights weights;
  // The shared expert, its x_fp8 the rank's home codes (the exchange's x_codes / x_scales over the
  // home rows, T rounded up to 128, zero rows past T).
  bool has_shared = false;
  gemm::Fp8ExpertPass shared;
  gemm::Fp8ExpertWeights shared_weights;
  // fp8_ready_counter_words(pass.rows.row_capacity, shared.rows.row_capacity or 0, pass.hidden,
  // pass.intermediate) device words.
  uint32_t* ready_counters = nullptr;
};

struct FusedForwardFp8Args {
  const transfer::TokenExchange* exchange = nullptr;  // with ExchangeOptions::fp8_dispatch
  RouterNormalization router;
  std::vector<FusedForwardFp8Rank> ranks;
  int comm_ctas = 0;
  // As FusedForwardArgs's; then the ring's rows are those dispatch_fp8 leaves, padding rows (zero
  // codes under the zero block's scale) included, for a backward that reads them.
  bool pull_all_rows = false;
};

// Device words a rank needs for `row_capacity` schedule rows and `shared_rows` rows of a shared
// expert (0: none): its readiness counters, the CTAs' task slots and producer scratch; 32-byte
// aligned.
size_t ready_counter_words(int row_capacity, int shared_rows);

// The same for the FP8 launch, whose routed tasks come from a table (forward_task_table.cuh) after
// those, sized for experts of hidden size `hidden` and intermediate size `intermediate`.
size_t fp8_ready_counter_words(int row_capacity, int shared_rows, int hidden, int intermediate);

// CTAs per rank of the fused launch on `world`'s device (one per SM, shared by the local ranks).
int fused_ctas_per_rank(const comm::World& world);

// The comm CTAs per rank used when FusedForwardArgs::comm_ctas is 0.
int default_comm_ctas(const comm::World& world);

// A pass on `stream`: zero_ready_counters, then exchange->build_schedule, then fused_forward, with
// nothing between the last two: the kernel starts while the schedule is built (programmatic
// dependent launch, device/comm/grid_dependency.cuh), its shared-expert tiles needing none of it;
// the pulls and the routed tasks wait for the schedule's launch to complete. After anything else
// it starts when that completes, as any launch.

// Zeroes every rank's readiness counters on `stream`.
void zero_ready_counters(const FusedForwardArgs& args, cudaStream_t stream);

// Launches on `stream` (the counters zeroed since the last launch on them). Throws caracal::Error
// for a world of more than kFusedMaxLocalRanks local ranks, comm_ctas outside
// [1, fused_ctas_per_rank - 1] or arguments the grouped GEMMs refuse.
void fused_forward(comm::World& world, const FusedForwardArgs& args, cudaStream_t stream);

// The same for the FP8 forward (the exchange's x_codes and x_scales published before the launch, as
// for TokenExchange::dispatch_fp8). fused_fp8_ctas_per_rank: its CTAs per rank.
void zero_ready_counters(const FusedForwardFp8Args& args, cudaStream_t stream);
void fused_forward(comm::World& world, const FusedForwardFp8Args& args, cudaStream_t stream);
int fused_fp8_ctas_per_rank(const comm::World& world);

}  // namespace caracal::fused
