#pragma once
// The fused forward (DESIGN §3): one persistent launch per forward pass per GPU (one for all ranks
// of a loopback world) that pulls the dispatch rows, runs the shared expert's and the routed
// experts' grouped GEMMs and pushes the routed outputs home as one g-weighted sum per (token, rank,
// macrobatch) (combine's expert side, src/device/transfer/group_sum.cuh), the GEMM tiles of a
// 128-row block starting as soon as its rows have landed (readiness counters, never a host
// synchronization). Communication CTAs (the first comm_ctas of each rank) pull; the others take the
// rank's tasks from one counter (the shared expert's up/gate+SwiGLU tiles, its down tiles, then the
// routed experts' likewise and the group sums, macrobatch by macrobatch), and the comm CTAs join
// them once their pulls are done. The schedule, the gates and the combine stay their own launches
// around it: the last macrobatch walked, macrobatch 0 (all of a balanced step), leaves its output
// rows in pass.out's ring rows, and TokenExchange::combine_after_fused_forward pushes their sums on
// every SM, then sums the home slots.
//
// The ring (DESIGN §2): with pass.rows.ring_rows > 0 the routed rows' buffers (expert_x, gate_up,
// activation, out) hold ring_rows rows, schedule row r in buffer row r % ring_rows; the launch walks the
// schedule in macrobatches of ring_rows rows from the last one down, and a block's rows take over
// the ring rows of the block ring_rows further on only once that block's tiles have read them. At
// the end the ring holds macrobatch 0 (schedule rows [0, ring_rows)). ring_rows = 0: one
// macrobatch, buffers of row_capacity rows.
//
// It needs no world barrier: the rows it pulls (every rank's x) were published before
// build_schedule's last barrier, the home slots it writes were last read by each peer's previous
// combine, which that barrier follows, and no peer reads what else it writes (expert_x, gate_up,
// activation of its own rank) before the next launch's entry barrier.
//
// The up/gate GEMM reads each row's x where it is (a token on this GPU: its home x; a token of
// another GPU: the row the comm CTAs pulled into expert_x), so rows of tokens on this GPU are never
// copied; expert_x holds only the pulled rows afterwards (the backward's weight gradients need all
// of them: MoELayer's backward pulls each macrobatch's rows with TokenExchange::dispatch).
//
// Output: the same bits as gemm::expert_forward of the shared expert, then TokenExchange::dispatch,
// gemm::expert_forward of the routed experts and TokenExchange::combine's push with group_rows =
// ring_rows (the same tiles, K order, epilogues and group sums), whatever comm_ctas; with ring_rows
// = 0 or a ring that holds the step, the same as combine's groups per (token, rank).
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "caracal/comm/world.hpp"
#include "caracal/gemm/expert_pass.hpp"
#include "caracal/transfer/token_exchange.hpp"

namespace caracal::fused {

// The fused kernels' parameters hold every local rank's GEMM descriptors: at most this many.
inline constexpr int kFusedMaxLocalRanks = 8;
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

// Device words a rank needs for `row_capacity` schedule rows and `shared_rows` rows of a shared
// expert (0: none): its readiness counters and the CTAs' task slots; 32-byte aligned.
size_t ready_counter_words(int row_capacity, int shared_rows);

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

}  // namespace caracal::fused
