// The fused forward kernel (src/fused/fused_forward.hpp): per rank, comm CTAs pull the dispatch
// rows while the other CTAs run the up/gate+SwiGLU and down tiles as their rows become ready; the
// comm CTAs join them once their pulls are done.
#include <algorithm>

#include "caracal/comm/cuda_check.hpp"
#include "caracal/error.hpp"
#include "device/comm/grid_dependency.cuh"
#include "comm/launch.cuh"
#include "fused/fused_forward.hpp"
#include "fused/fused_launch.hpp"
#include "gemm/forward_descriptors.cuh"
#include "gemm/host_checks.hpp"
#include "fused/forward_compute.cuh"
#include "fused/forward_params.cuh"
#include "fused/forward_pull.cuh"
#include "transfer/exchange_internals.hpp"
#include "transfer/exchange_launch.hpp"

namespace caracal::fused {
namespace {

static_assert(kMaxLocalRanks == kFusedMaxLocalRanks);

__global__ void __launch_bounds__(gemm::kThreads, 1)
    fused_forward_kernel(comm::DeviceWorld world, CUTE_GRID_CONSTANT ForwardKernelParams const p) {
  __shared__ int producer_task;  // the producer warpgroup's (forward_compute.cuh)
  extern __shared__ uint8_t smem_raw[];
  if (comm::cta_of_rank(world) < p.comm_ctas) {
    comm::wait_for_previous_grid();  // the schedule's launch (fused_forward.hpp)
    const comm::CtaPlace place = comm::role_place(world, 0, p.comm_ctas);
    // A failed wait is recorded; the CTA computes on, and its own waits fail as fast.
    (void)pull_forward_rows(world, place, p.schedule, p.pull, p.ranks[place.local_rank], p.pull_all_rows,
                            p.rows_per_route);
  }
  // Every CTA computes, comm CTAs once their pulls are done: tasks come from the rank's counter.
  const comm::CtaPlace place = comm::whole_launch_place(world);
  const FusedForwardRankParams& rank = p.ranks[place.local_rank];
  run_forward_tasks(world, place, rank, p, gemm::kernel_storage<ForwardGemmPolicy>(smem_raw),
                    producer_task);
}

constexpr const char* kName = "fused forward";

// One group of experts' GEMMs but the down epilogue: the standalone launchers' descriptors
// (gemm/forward_descriptors.cuh) over `pass`'s rows, the row buffers' maps over the rows they hold
// (ring_rows of the ring, else the row capacity), pass.out's too.
struct GroupGemms {
  ExpertGemms gemms;
  gemm::RowsBf16Epilogue::Params out;
};
GroupGemms expert_gemms(const gemm::ExpertPass& pass, const gemm::ExpertPassWeights& weights,
                        uint32_t* activation_ready) {
  using namespace gemm;
  const ScheduleView& schedule = pass.rows;
  CARACAL_CHECK(schedule.ring_rows >= 0 && schedule.ring_rows % kBlockM == 0 && schedule.ring_rows <= schedule.row_capacity,
                kName, ": rows.ring_rows must be 0 or a multiple of ", kBlockM, " up to row_capacity = ",
                schedule.row_capacity, ", got ", schedule.ring_rows);
  CARACAL_CHECK(schedule.first_row == 0 && schedule.end_row == 0, kName,
                ": rows.first_row and rows.end_row must be 0 (the launch walks the whole schedule), got ",
                schedule.first_row, " and ", schedule.end_row);
  // The launch takes its tiles from the rank's task counter: no tile queue, no CTA count.
  UpGateSwigluArgs up = up_gate_gemm_args(pass, weights);
  up.rows.ring_rows = 0;  // the standalone checks take a ring in windows; this launch walks all of it
  up.num_ctas = 0;
  up.tile_queue = nullptr;
  check_up_gate_swiglu_args(up);
  DownProjArgs down = down_gemm_args(pass, weights);
  down.rows = up.rows;
  down.num_ctas = 0;
  down.tile_queue = nullptr;
  check_down_proj_args(down);

  const uint64_t rows = uint64_t(schedule.ring_rows > 0 ? schedule.ring_rows : schedule.row_capacity);
  up.rows = schedule;  // the tiles walk the ring's schedule
  down.rows = schedule;
  const UpGateSwigluDescriptors u = up_gate_swiglu_descriptors(up, rows);
  const DownProjDescriptors d = down_proj_descriptors(down, rows);
  GroupGemms g{};
  g.gemms.up_mainloop = u.mainloop;
  g.gemms.up_epilogue = u.epilogue;
  g.gemms.down_mainloop = d.mainloop;
  g.gemms.tiles = {u.tiles, d.tiles};
  g.gemms.activation_ready = activation_ready;
  g.out = d.epilogue;
  return g;
}

// Rank l's parameters: its GEMMs and where its counters and task slots are.
FusedForwardRankParams rank_params(const FusedForwardRank& rank) {
  CARACAL_CHECK(rank.ready_counters != nullptr, kName, ": ready_counters must not be null");
  const int shared_rows = rank.has_shared ? rank.shared.rows.row_capacity : 0;
  const ForwardCounters counters(rank.ready_counters, rank.pass.rows.row_capacity, shared_rows);
  FusedForwardRankParams r{};
  r.x_ready = counters.x_ready;
  const GroupGemms routed = expert_gemms(rank.pass, rank.weights, counters.activation_ready);
  r.routed = routed.gemms;
  r.routed_out = routed.out;
  r.out_rows = rank.pass.out;
  r.down_done = counters.down_done;
  r.out_stored = counters.out_stored;
  r.sums_done = counters.sums_done;
  r.has_shared = rank.has_shared;
  if (rank.has_shared) {
    CARACAL_CHECK(rank.shared.rows.num_experts == 1, kName, ": the shared pass must hold one expert, got ",
                  rank.shared.rows.num_experts);
    CARACAL_CHECK(rank.shared.rows.ring_rows == 0, kName, ": the shared pass has no ring, got ring_rows ",
                  rank.shared.rows.ring_rows);
    const GroupGemms shared = expert_gemms(rank.shared, rank.shared_weights, counters.shared_activation_ready);
    r.shared = shared.gemms;
    r.shared_out = shared.out;
  }
  r.task_counter = counters.task_counter;
  r.task_slots = task_slots_after<TaskSlot>(rank.ready_counters, counters.words);
  return r;
}

}  // namespace

size_t ready_counter_words(int row_capacity, int shared_rows) {
  return counters_and_task_slots_words<ForwardGemmPolicy>(ForwardCounters(nullptr, row_capacity, shared_rows).words,
                                                          sizeof(TaskSlot));
}

int fused_ctas_per_rank(const comm::World& world) {
  return fused_kernel_ctas_per_rank<ForwardGemmPolicy>(world, fused_forward_kernel, kName);
}

int default_comm_ctas(const comm::World& world) { return std::max(1, fused_ctas_per_rank(world) / 16); }

void zero_ready_counters(const FusedForwardArgs& args, cudaStream_t stream) {
  for (const FusedForwardRank& rank : args.ranks) {
    CARACAL_CHECK(rank.ready_counters != nullptr, kName, ": ready_counters must not be null");
    const ForwardCounters counters(rank.ready_counters, rank.pass.rows.row_capacity,
                                   rank.has_shared ? rank.shared.rows.row_capacity : 0);
    check_cuda(cudaMemsetAsync(rank.ready_counters, 0, counters.words * sizeof(uint32_t), stream),
               "fused forward: cudaMemsetAsync(ready counters)");
  }
}

void fused_forward(comm::World& world, const FusedForwardArgs& args, cudaStream_t stream) {
  CARACAL_CHECK(args.exchange != nullptr, kName, ": exchange must not be null");
  const int local_ranks = world.local_ranks();
  CARACAL_CHECK(local_ranks <= kFusedMaxLocalRanks, kName, ": at most ", kFusedMaxLocalRanks,
                " local ranks (the kernel's parameters hold each rank's GEMM descriptors), got ", local_ranks);
  CARACAL_CHECK(static_cast<int>(args.ranks.size()) == local_ranks, kName, ": ranks must hold one entry per local rank (",
                local_ranks, "), got ", args.ranks.size());
  const transfer::detail::ExchangeArgs& exchange = transfer::ExchangeInternals::kernel_args(*args.exchange);
  CARACAL_CHECK(exchange.schedule.tile_m == gemm::kBlockM, kName, ": the exchange's tile_m must be ", gemm::kBlockM,
                ", got ", exchange.schedule.tile_m);
  comm::LaunchShape shape = fused_launch_shape<ForwardGemmPolicy>(fused_ctas_per_rank(world), kName);
  const int comm_ctas = checked_comm_ctas(args.comm_ctas == 0 ? default_comm_ctas(world) : args.comm_ctas, shape, kName);

  ForwardKernelParams p{};
  for (int l = 0; l < local_ranks; ++l) {
    const FusedForwardRank& rank = args.ranks[static_cast<size_t>(l)];
    // The down tiles push each row to the home slot its schedule row names.
    CARACAL_CHECK(rank.pass.rows.rows == args.exchange->schedule_view(l).rows &&
                      rank.pass.rows.expert_offset == args.exchange->schedule_view(l).expert_offset,
                  kName, ": ranks[", l, "].pass.rows must be the exchange's schedule view of local rank ", l,
                  " (with a ring_rows of its own where the exchange has none)");
    const int exchange_ring = args.exchange->options().ring_rows;
    CARACAL_CHECK(exchange_ring == 0 || rank.pass.rows.ring_rows == exchange_ring, kName, ": ranks[", l,
                  "].pass.rows.ring_rows must be the exchange's ring (", exchange_ring,
                  " rows: its expert_x holds that many), got ", rank.pass.rows.ring_rows);
    // Macrobatch 0's output rows wait there for TokenExchange::combine_after_fused_forward.
    CARACAL_CHECK(rank.pass.out == world.local_pointer(args.exchange->backward_buffers().expert_dy, l), kName,
                  ": ranks[", l, "].pass.out must be the exchange's expert_dy of local rank ", l);
    p.ranks[l] = rank_params(rank);
  }
  p.schedule = exchange.schedule;
  p.pull = transfer::PullRows{exchange.forward.x, exchange.forward.expert_x, {}, {}, exchange.top_k, exchange.hidden};
  p.sums = {exchange.forward.combine_slots, exchange.router.topk_scores,
            {static_cast<float>(args.router.scale), args.router.normalize}};
  p.comm_ctas = comm_ctas;
  p.pull_all_rows = args.pull_all_rows;
  p.rows_per_route = exchange.rows_per_route;
  shape.starts_early = true;  // while build_schedule runs (fused_forward.hpp)
  comm::launch(world, "fused forward", shape, stream, fused_forward_kernel, p);
}

}  // namespace caracal::fused
