// The fused backward in bf16 over one window (src/fused/fused_backward.hpp):
// fused_backward_kernel<Bf16BackwardGemms> (backward_launch.cuh), the only kernel instantiated in
// this unit, on the standalone bf16 GEMMs' descriptors; its comm CTAs pull the window's dy rows
// (then its x rows, where asked).
#include <algorithm>

#include "caracal/comm/cuda_check.hpp"
#include "caracal/error.hpp"
#include "fused/backward_launch.cuh"
#include "fused/fused_backward.hpp"
#include "fused/fused_forward.hpp"
#include "fused/fused_launch.hpp"
#include "gemm/backward_descriptors.cuh"
#include "gemm/epilogue_params.hpp"
#include "gemm/host_checks.hpp"
#include "transfer/exchange_internals.hpp"
#include "transfer/exchange_launch.hpp"

namespace caracal::fused {
namespace {

using Gemms = Bf16BackwardGemms;
using Policy = Gemms::Policy;

constexpr const char* kName = "fused backward";

// The shared expert's rows of a rank (0 without).
int shared_rows_of(const FusedBackwardRank& rank) { return rank.has_shared ? rank.shared.rows.buffer_rows() : 0; }

// Rank l's parameters: its GEMMs over the window and where its counters and task slots are (zeroed
// on `stream`).
FusedBackwardRankParams<Gemms> rank_params(comm::World& world, const transfer::TokenExchange& exchange, int l,
                                           const FusedBackwardRank& rank, cudaStream_t stream) {
  using namespace gemm;
  const ExpertPass& pass = rank.pass;
  const ScheduleView& rows = pass.rows;
  CARACAL_CHECK(rank.ready_counters != nullptr, kName, ": ranks[", l, "].ready_counters must not be null");
  CARACAL_CHECK(rows.rows == exchange.schedule_view(l).rows && rows.expert_offset == exchange.schedule_view(l).expert_offset,
                kName, ": ranks[", l, "].pass.rows must be the exchange's schedule view of local rank ", l,
                " (its rows name the home slots)");
  CARACAL_CHECK(rows.ring_rows == exchange.options().ring_rows, kName, ": ranks[", l,
                "].pass.rows.ring_rows must be the exchange's ring (", exchange.options().ring_rows, " rows), got ",
                rows.ring_rows);
  CARACAL_CHECK(rows.end_row > rows.first_row, kName, ": ranks[", l,
                "].pass.rows must name its window: end_row > first_row, got [", rows.first_row, ", ", rows.end_row, ")");
  const transfer::BackwardBuffers& buffers = exchange.backward_buffers();
  CARACAL_CHECK(pass.dy == world.local_pointer(buffers.expert_dy, l) && pass.gates == world.local_pointer(buffers.expert_gates, l),
                kName, ": ranks[", l, "].pass.dy and .gates must be the exchange's expert_dy and expert_gates of local rank ",
                l, " (the launch pulls them)");
  const DownDgradSwigluArgs dgrad = dgrad_gemm_args(pass, rank.weights);
  check_down_dgrad_swiglu_args(dgrad);
  GateUpDgradArgs dx = dx_gemm_args(pass, rank.weights);
  dx.dx_out = nullptr;  // the rows go to their home slots
  check_gate_up_dgrad_args(dx, /*dx_stored=*/false);

  const DownDgradSwigluDescriptors d = down_dgrad_swiglu_descriptors(dgrad);
  const GateUpDgradDescriptors x = gate_up_dgrad_descriptors(dx);
  FusedBackwardRankParams<Gemms> r{};
  r.dgrad_mainloop = d.mainloop;
  r.dgrad_epilogue = d.epilogue;
  r.dx_mainloop = x.mainloop;
  const bool grouped = groups_dx_rows(exchange);
  r.dx_epilogue = {rows.rows, world.device_heap_table(), buffers.dx_slots, pass.hidden, world.first_local_rank() + l,
                   grouped ? world.local_pointer(buffers.expert_dx, l) : nullptr};
  r.tiles.dgrad = d.tiles;
  r.tiles.dx = x.tiles;
  r.tiles.group_dx = grouped;
  r.tiles.has_shared = rank.has_shared;
  if (rank.has_shared) {
    // The standalone kernels' arguments and checks (src/gemm/down_dgrad_swiglu.cu,
    // gate_up_dgrad.cu), without their tile queue: the launch's counter orders the tiles.
    DownDgradSwigluArgs shared_dgrad = dgrad_gemm_args(rank.shared, rank.shared_weights);
    shared_dgrad.tile_queue = nullptr;
    check_down_dgrad_swiglu_args(shared_dgrad);
    GateUpDgradArgs shared_dx = dx_gemm_args(rank.shared, rank.shared_weights);
    shared_dx.tile_queue = nullptr;
    check_gate_up_dgrad_args(shared_dx);
    CARACAL_CHECK(rank.shared.rows.ring_rows == 0 && rank.shared.rows.first_row == 0 && rank.shared.rows.end_row == 0,
                  kName, ": ranks[", l, "].shared.rows must be one window of every row (no ring)");
    CARACAL_CHECK(rank.shared_dx_rows >= 1 && rank.shared_dx_rows <= rank.shared.rows.buffer_rows(), kName, ": ranks[",
                  l, "].shared_dx_rows must be in [1, ", rank.shared.rows.buffer_rows(), "], got ", rank.shared_dx_rows);
    CARACAL_CHECK(rank.shared.dx != rank.shared.x, kName, ": ranks[", l,
                  "].shared.dx must not be shared.x (the shared expert's weight gradients read x after the launch)");
    const DownDgradSwigluDescriptors sd = down_dgrad_swiglu_descriptors(shared_dgrad);
    const GateUpDgradDescriptors sx = gate_up_dgrad_descriptors(shared_dx);
    r.shared_dgrad_mainloop = sd.mainloop;
    r.shared_dgrad_epilogue = sd.epilogue;
    r.shared_dx_mainloop = sx.mainloop;
    // TMA stores no row past the map's: the padding rows' dx is not written.
    r.shared_dx_epilogue =
        gemm::rows_epilogue_params(shared_dx.dx_out, uint64_t(rank.shared_dx_rows), rank.shared.hidden, "shared dx");
    r.tiles.shared_dgrad = sd.tiles;
    r.tiles.shared_dx = sx.tiles;
  }
  place_backward_counters(r, rank.ready_counters, rows.buffer_rows(), shared_rows_of(rank), stream, kName);
  return r;
}

}  // namespace

size_t backward_ready_counter_words(int buffer_rows, int shared_rows) {
  return backward_counter_words<Gemms>(buffer_rows, shared_rows);
}

bool groups_dx_rows(const transfer::TokenExchange& exchange) {
  const transfer::ExchangeOptions& o = exchange.options();
  return o.expert_dx && o.ring_rows > 0 && !o.rows_per_route && exchange.world().world_size() > 1;
}

int fused_backward_ctas_per_rank(const comm::World& world) {
  return backward_ctas_per_rank<Gemms>(world, kName);
}

int default_backward_comm_ctas(const comm::World& world, bool local_rows_in_launch) {
  // Every rank on this GPU: no row to pull, the idle warps copy them all.
  if (local_rows_in_launch && world.local_ranks() == world.world_size()) return 1;
  return std::max(1, fused_backward_ctas_per_rank(world) / 16);
}

void fused_backward(comm::World& world, const FusedBackwardArgs& args, cudaStream_t stream) {
  CARACAL_CHECK(args.exchange != nullptr, kName, ": exchange must not be null");
  const transfer::TokenExchange& exchange = *args.exchange;
  const int local_ranks = world.local_ranks();
  CARACAL_CHECK(local_ranks <= kFusedMaxLocalRanks, kName, ": at most ", kFusedMaxLocalRanks,
                " local ranks (the kernel's parameters hold each rank's GEMM descriptors), got ", local_ranks);
  CARACAL_CHECK(static_cast<int>(args.ranks.size()) == local_ranks, kName, ": ranks must hold one entry per local rank (",
                local_ranks, "), got ", args.ranks.size());
  CARACAL_CHECK(exchange.options().backward, kName, ": the exchange needs ExchangeOptions::backward = true");
  const transfer::detail::ExchangeArgs& ex = transfer::ExchangeInternals::kernel_args(exchange);
  CARACAL_CHECK(ex.schedule.tile_m == gemm::kBlockM, kName, ": the exchange's tile_m must be ", gemm::kBlockM, ", got ",
                ex.schedule.tile_m);
  const comm::LaunchShape shape =
      fused_launch_shape<Policy>(fused_backward_ctas_per_rank(world), kName);
  // The idle warps copy the rows of tokens on this GPU, but with pull_all_rows (tests), which gives
  // every real row to the pull role.
  const bool local_rows_in_launch = !args.pull_all_rows;
  const int comm_ctas = checked_comm_ctas(
      args.comm_ctas == 0 ? default_backward_comm_ctas(world, local_rows_in_launch) : args.comm_ctas, shape, kName);

  BackwardKernelParams<Gemms> p{};
  const ScheduleView& window = args.ranks.front().pass.rows;
  for (int l = 0; l < local_ranks; ++l) {
    const FusedBackwardRank& rank = args.ranks[static_cast<size_t>(l)];
    CARACAL_CHECK(rank.pass.rows.first_row == window.first_row && rank.pass.rows.end_row == window.end_row, kName,
                  ": every rank's pass.rows must name the same window, got [", window.first_row, ", ", window.end_row,
                  ") for ranks[0] and [", rank.pass.rows.first_row, ", ", rank.pass.rows.end_row, ") for ranks[", l, "]");
    p.ranks[l] = rank_params(world, exchange, l, rank, stream);
  }
  p.schedule = ex.schedule;
  p.dy_pull = transfer::PullRows{ex.backward.dy, ex.backward.expert_dy, ex.router.gates, ex.backward.expert_gates,
                                 ex.top_k, ex.hidden};
  p.x_pull = transfer::PullRows{ex.forward.x, ex.forward.expert_x, {}, {}, ex.top_k, ex.hidden};
  p.x_window = transfer::PullWindow{window.first_row, window.end_row, window.ring_rows, args.x_in_place, false};
  p.comm_ctas = comm_ctas;
  p.pull_x = args.pull_x;
  p.pull_all_rows = args.pull_all_rows;
  p.local_rows_in_launch = local_rows_in_launch;
  p.rows_per_route = ex.rows_per_route;
  launch_fused_backward(world, shape, p, args, stream, kName);
}

}  // namespace caracal::fused
