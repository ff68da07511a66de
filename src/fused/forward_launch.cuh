#pragma once
// The fused forward's kernel and launch in the precision of `Gemms` (forward_gemms.cuh), for its two
// units: forward.cu (bf16) and forward_fp8.cu (FP8), each instantiating one kernel. Per rank, comm
// CTAs pull the dispatch rows while the other CTAs run the up/gate+SwiGLU and down tiles as their
// rows become ready; the comm CTAs join them once their pulls are done. A unit supplies its
// precision's GEMM descriptors (a GroupGemms per group of experts) and its kernel's pull source.
#include <algorithm>
#include <vector>

#include "caracal/comm/cuda_check.hpp"
#include "caracal/error.hpp"
#include "comm/launch.cuh"
#include "device/comm/grid_dependency.cuh"
#include "fused/forward_compute.cuh"
#include "fused/forward_params.cuh"
#include "fused/forward_pull.cuh"
#include "fused/forward_task_table.cuh"
#include "fused/fused_forward.hpp"
#include "fused/fused_launch.hpp"
#include "transfer/exchange_internals.hpp"
#include "transfer/exchange_launch.hpp"

namespace caracal::fused {

template <class Gemms>
__global__ void __launch_bounds__(gemm::kThreads, 1)
    fused_forward_kernel(comm::DeviceWorld world, CUTE_GRID_CONSTANT ForwardKernelParams<Gemms> const p) {
  extern __shared__ uint8_t smem_raw[];  // the GEMMs' storage alone (the FP8 one fills 227 KiB)
  if (comm::cta_of_rank(world) < p.comm_ctas) {
    comm::wait_for_previous_grid();  // the schedule's launch (fused_forward.hpp)
    const comm::CtaPlace place = comm::role_place(world, 0, p.comm_ctas);
    // A failed wait is recorded; the CTA computes on, and its own waits fail as fast.
    (void)pull_forward_rows<Gemms>(world, place, p.schedule, p.pull, p.ranks[place.local_rank], p.pull_all_rows,
                                   p.rows_per_route, p.zero_padding_rows);
  }
  // Every CTA computes, comm CTAs once their pulls are done: tasks come from the rank's counter.
  const comm::CtaPlace place = comm::whole_launch_place(world);
  const FusedForwardRankParams<Gemms>& rank = p.ranks[place.local_rank];
  run_forward_tasks<Gemms>(world, place, rank, p, gemm::kernel_storage<typename Gemms::Policy>(smem_raw));
}

// One group of experts' GEMMs but the down epilogue, and the down epilogue's parameters.
template <class Gemms>
struct GroupGemms {
  ExpertGemms<Gemms> gemms;
  typename Gemms::Down::Epilogue::Params out;
};

// The checks every group's pass takes: the launch walks the whole schedule, over a ring or not.
template <class Pass>
void check_forward_pass(const Pass& pass, const char* name) {
  const ScheduleView& schedule = pass.rows;
  CARACAL_CHECK(schedule.ring_rows >= 0 && schedule.ring_rows % gemm::kBlockM == 0 &&
                    schedule.ring_rows <= schedule.row_capacity,
                name, ": rows.ring_rows must be 0 or a multiple of ", gemm::kBlockM, " up to row_capacity = ",
                schedule.row_capacity, ", got ", schedule.ring_rows);
  CARACAL_CHECK(schedule.first_row == 0 && schedule.end_row == 0, name,
                ": rows.first_row and rows.end_row must be 0 (the launch walks the whole schedule), got ",
                schedule.first_row, " and ", schedule.end_row);
}

// Where a rank's task slots, producer scratch (a CTA's each) and task table (table_entries) lie after
// its `counter_words` ready counters at `base` (RankWords); with a null base only `words` is counted.
template <int kStages>
struct ForwardRankWords {
  TaskSlot* task_slots;
  ProducerScratch* producer_scratch;
  ForwardTask* task_table;
  size_t words;

  ForwardRankWords(uint32_t* base, size_t counter_words, size_t table_entries) {
    RankWords w(base, counter_words);
    task_slots = take_task_slots<TaskSlot, kStages>(w);
    producer_scratch = w.take<ProducerScratch>(kFusedMaxCtasPerRank);
    task_table = w.take<ForwardTask>(table_entries);
    words = w.words();
  }
};

// Rank `rank`'s parameters (a FusedForwardRank or FusedForwardFp8Rank): its GEMMs by `expert_gemms`
// (pass, weights, activation_ready) and where its counters and task slots are.
template <class Gemms, class Rank, class ExpertGemmsOf>
FusedForwardRankParams<Gemms> forward_rank_params(const Rank& rank, ExpertGemmsOf&& expert_gemms, const char* name) {
  CARACAL_CHECK(rank.ready_counters != nullptr, name, ": ready_counters must not be null");
  const int shared_rows = rank.has_shared ? rank.shared.rows.row_capacity : 0;
  const ForwardCounters counters(rank.ready_counters, rank.pass.rows.row_capacity, shared_rows);
  FusedForwardRankParams<Gemms> r{};
  r.x_ready = counters.x_ready;
  const GroupGemms<Gemms> routed = expert_gemms(rank.pass, rank.weights, counters.activation_ready);
  r.routed = routed.gemms;
  r.routed_out = routed.out;
  r.out_rows = rank.pass.out;
  r.down_done = counters.down_done;
  r.out_stored = counters.out_stored;
  r.sums_done = counters.sums_done;
  r.has_shared = rank.has_shared;
  if (rank.has_shared) {
    CARACAL_CHECK(rank.shared.rows.num_experts == 1, name, ": the shared pass must hold one expert, got ",
                  rank.shared.rows.num_experts);
    CARACAL_CHECK(rank.shared.rows.ring_rows == 0, name, ": the shared pass has no ring, got ring_rows ",
                  rank.shared.rows.ring_rows);
    const GroupGemms<Gemms> shared = expert_gemms(rank.shared, rank.shared_weights, counters.shared_activation_ready);
    r.shared = shared.gemms;
    r.shared_out = shared.out;
  }
  r.task_counter = counters.task_counter;
  const ForwardRankWords<Gemms::Policy::kStages> words(rank.ready_counters, counters.words, 0);
  r.task_slots = words.task_slots;
  r.producer_scratch = words.producer_scratch;
  r.task_table = words.task_table;
  if constexpr (Gemms::TaskHandOff::kReadsTaskTable) {
    const size_t tasks = forward_task_table_entries(rank.pass.rows.row_capacity, r.routed.tiles.up.n_blocks,
                                                    r.routed.tiles.down.n_blocks);
    const size_t room =
        forward_task_table_entries_of_shape(rank.pass.rows.row_capacity, rank.pass.hidden, rank.pass.intermediate);
    CARACAL_CHECK(tasks <= room, name, ": the task table needs ", tasks, " entries, fp8_ready_counter_words left ", room,
                  " (its GEMMs' N blocks are not those of D = ", rank.pass.hidden, " and I = ", rank.pass.intermediate, ")");
  }
  return r;
}

// The task table's launch (forward_task_table.cuh) for `p`'s ranks, right before the fused kernel's.
template <class Gemms>
void launch_forward_task_table(comm::World& world, const ForwardKernelParams<Gemms>& p, cudaStream_t stream,
                               const char* name) {
  ForwardTaskTableParams t{};
  for (int l = 0; l < world.local_ranks(); ++l) {
    const FusedForwardRankParams<Gemms>& r = p.ranks[l];
    t.ranks[l] = {r.shared.tiles, r.routed.tiles, r.has_shared, const_cast<ForwardTask*>(r.task_table)};
  }
  launch_forward_task_table(world, t, stream, name);
}

// CTAs per rank of the precision's launch.
template <class Gemms>
int forward_ctas_per_rank(const comm::World& world, const char* name) {
  return fused_kernel_ctas_per_rank<typename Gemms::Policy>(world, fused_forward_kernel<Gemms>, name);
}

template <class Args>
void zero_forward_counters(const Args& args, cudaStream_t stream, const char* name) {
  for (const auto& rank : args.ranks) {
    CARACAL_CHECK(rank.ready_counters != nullptr, name, ": ready_counters must not be null");
    const ForwardCounters counters(rank.ready_counters, rank.pass.rows.row_capacity,
                                   rank.has_shared ? rank.shared.rows.row_capacity : 0);
    check_cuda(cudaMemsetAsync(rank.ready_counters, 0, counters.words * sizeof(uint32_t), stream),
               "fused forward: cudaMemsetAsync(ready counters)");
  }
}

// Checks `args` (a FusedForwardArgs or FusedForwardFp8Args) against the world and the exchange and
// launches: each rank's GEMMs by `expert_gemms`, the rows pulled by `pull` (the exchange's buffers in
// the precision's form) and gathered from `row_bases`, with `zero_padding_rows` the ring's padding
// rows written too.
template <class Gemms, class Args, class ExpertGemmsOf>
void launch_fused_forward(comm::World& world, const Args& args, const typename Gemms::Pull& pull,
                          const typename Gemms::RowBases& row_bases, ExpertGemmsOf&& expert_gemms,
                          bool zero_padding_rows, cudaStream_t stream, const char* name) {
  CARACAL_CHECK(args.exchange != nullptr, name, ": exchange must not be null");
  const int local_ranks = world.local_ranks();
  CARACAL_CHECK(local_ranks <= Gemms::kMaxLocalRanks, name, ": at most ", Gemms::kMaxLocalRanks,
                " local ranks (the kernel's parameters hold each rank's GEMM descriptors), got ", local_ranks);
  CARACAL_CHECK(static_cast<int>(args.ranks.size()) == local_ranks, name,
                ": ranks must hold one entry per local rank (", local_ranks, "), got ", args.ranks.size());
  const transfer::detail::ExchangeArgs& exchange = transfer::ExchangeInternals::kernel_args(*args.exchange);
  CARACAL_CHECK(exchange.schedule.tile_m == gemm::kBlockM, name, ": the exchange's tile_m must be ", gemm::kBlockM,
                ", got ", exchange.schedule.tile_m);
  const int ctas_per_rank = forward_ctas_per_rank<Gemms>(world, name);
  comm::LaunchShape shape = fused_launch_shape<typename Gemms::Policy>(ctas_per_rank, name);
  const int default_comm = std::max(1, ctas_per_rank / 16);
  const int comm_ctas = checked_comm_ctas(args.comm_ctas == 0 ? default_comm : args.comm_ctas, shape, name);

  ForwardKernelParams<Gemms> p{};
  for (int l = 0; l < local_ranks; ++l) {
    const auto& rank = args.ranks[static_cast<size_t>(l)];
    // The down tiles push each row to the home slot its schedule row names.
    CARACAL_CHECK(rank.pass.rows.rows == args.exchange->schedule_view(l).rows &&
                      rank.pass.rows.expert_offset == args.exchange->schedule_view(l).expert_offset,
                  name, ": ranks[", l, "].pass.rows must be the exchange's schedule view of local rank ", l,
                  " (with a ring_rows of its own where the exchange has none)");
    const int exchange_ring = args.exchange->options().ring_rows;
    CARACAL_CHECK(exchange_ring == 0 || rank.pass.rows.ring_rows == exchange_ring, name, ": ranks[", l,
                  "].pass.rows.ring_rows must be the exchange's ring (", exchange_ring,
                  " rows: its expert_x holds that many), got ", rank.pass.rows.ring_rows);
    // Macrobatch 0's output rows wait there for TokenExchange::combine_after_fused_forward.
    CARACAL_CHECK(rank.pass.out == world.local_pointer(args.exchange->backward_buffers().expert_dy, l), name,
                  ": ranks[", l, "].pass.out must be the exchange's expert_dy of local rank ", l);
    p.ranks[l] = forward_rank_params<Gemms>(rank, expert_gemms, name);
  }
  p.schedule = exchange.schedule;
  p.pull = pull;
  p.sums = {exchange.forward.combine_slots, exchange.router.topk_scores,
            {static_cast<float>(args.router.scale), args.router.normalize}};
  p.comm_ctas = comm_ctas;
  p.pull_all_rows = args.pull_all_rows;
  p.zero_padding_rows = zero_padding_rows;
  p.rows_per_route = exchange.rows_per_route;
  p.row_bases = row_bases;
  if constexpr (Gemms::TaskHandOff::kReadsTaskTable) launch_forward_task_table(world, p, stream, name);
  shape.starts_early = true;  // while build_schedule (and the task table's launch) run (fused_forward.hpp)
  comm::launch(world, name, shape, stream, fused_forward_kernel<Gemms>, p);
}

}  // namespace caracal::fused
