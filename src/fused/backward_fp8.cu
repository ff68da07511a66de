// The fused backward in FP8 (src/fused/fused_backward.hpp, FusedBackwardFp8Args):
// fused_backward_kernel<Fp8BackwardGemms> (backward_launch.cuh), the only kernel instantiated in
// this unit, on the standalone FP8 GEMMs' parameters (gemm/down_dgrad_swiglu_fp8_launch.cuh,
// gemm/fp8_descriptors.hpp), over the whole schedule with every dy row pulled before the launch.
#include "caracal/comm/cuda_check.hpp"
#include "caracal/error.hpp"
#include "fused/backward_launch.cuh"
#include "fused/fused_backward.hpp"
#include "gemm/down_dgrad_swiglu_fp8_launch.cuh"
#include "gemm/epilogue_params.hpp"
#include "gemm/fp8_descriptors.hpp"
#include "gemm/host_checks.hpp"
#include "transfer/exchange_internals.hpp"

namespace caracal::fused {
namespace {

using Gemms = Fp8BackwardGemms;
using Policy = Gemms::Policy;
using DgradTiles = gemm::Scheduled<Gemms::Dgrad, gemm::RowTileSchedulerOf<Policy::kBlockN>>;
using DxTiles = gemm::Scheduled<Gemms::Dx, gemm::RowTileSchedulerOf<Policy::kBlockN>>;
using SharedDxTiles = gemm::Scheduled<Gemms::SharedDx, gemm::RowTileSchedulerOf<Policy::kBlockN>>;

constexpr const char* kName = "fused backward (fp8)";

// One group of experts' dgrad and dx over `rows` (the launch's window), but the dx epilogue.
struct GroupGemms {
  Gemms::Dgrad::Epilogue::Params dgrad_epilogue;
  gemm::Mainloop<Policy>::Params dgrad_mainloop, dx_mainloop;
  gemm::RowTileParams dgrad_tiles, dx_tiles;
};

template <class Dx>
GroupGemms group_gemms(const gemm::Fp8ExpertPass& pass, const gemm::Fp8ExpertWeights& weights,
                       const ScheduleView& rows, bool dx_stored) {
  using namespace gemm;
  // The standalone launchers' arguments and checks, without their tile queue: the launch's counter
  // orders the tiles.
  Fp8DownDgradSwigluArgs dgrad = dgrad_gemm_args(pass, weights);
  dgrad.rows = rows;
  dgrad.num_ctas = 0;
  dgrad.tile_queue = nullptr;
  check_down_dgrad_swiglu_args(dgrad);
  Fp8GateUpDgradArgs dx = dx_gemm_args(pass, weights);
  dx.rows = rows;
  dx.num_ctas = 0;
  dx.tile_queue = nullptr;
  if (!dx_stored) dx.dx_out = nullptr;
  check_gate_up_dgrad_args(dx, dx_stored, Policy::kBlockN);
  const GemmParams<DgradTiles> d = fp8_down_dgrad_swiglu_params<DgradTiles>(dgrad);
  const GemmParams<Dx> x = fp8_row_gemm_params<Dx>(rows, dx.d_gate_up, dx.w_gate_up_t, uint64_t(pass.hidden),
                                                   2 * uint64_t(pass.intermediate), "d_gate_up", "w_gate_up_t", nullptr);
  return {d.epilogue, d.mainloop, x.mainloop, d.scheduler, x.scheduler};
}

// The pass's rows as the launch walks them: every row of the schedule, one window.
ScheduleView whole_schedule(const gemm::Fp8ExpertPass& pass, const char* what, int l) {
  const ScheduleView& rows = pass.rows;
  CARACAL_CHECK(rows.ring_rows == 0 && rows.first_row == 0 && rows.end_row == 0, kName, ": ranks[", l, "].", what,
                ".rows must be the whole schedule (ring_rows, first_row and end_row 0), got ", rows.ring_rows, ", ",
                rows.first_row, " and ", rows.end_row);
  ScheduleView window = rows;
  window.end_row = rows.row_capacity;
  return window;
}

int shared_rows_of(const FusedBackwardFp8Rank& rank) { return rank.has_shared ? rank.shared.rows.row_capacity : 0; }

// Rank l's parameters: its GEMMs over the schedule and where its counters and task slots are (zeroed
// on `stream`).
FusedBackwardRankParams<Gemms> rank_params(comm::World& world, const transfer::TokenExchange& exchange, int l,
                                           const FusedBackwardFp8Rank& rank, cudaStream_t stream) {
  const gemm::Fp8ExpertPass& pass = rank.pass;
  CARACAL_CHECK(pass.rows.rows == exchange.schedule_view(l).rows &&
                    pass.rows.expert_offset == exchange.schedule_view(l).expert_offset,
                kName, ": ranks[", l, "].pass.rows must be the exchange's schedule view of local rank ", l,
                " (its rows name the home slots)");
  const ScheduleView rows = whole_schedule(pass, "pass", l);
  const transfer::detail::ExchangeArgs& ex = transfer::ExchangeInternals::kernel_args(exchange);
  CARACAL_CHECK(pass.dy_fp8.codes == world.local_pointer(ex.backward.expert_dy_codes, l) &&
                    pass.dy_fp8.scales == world.local_pointer(ex.backward.expert_dy_scales, l) &&
                    pass.gates == world.local_pointer(ex.backward.expert_gates, l),
                kName, ": ranks[", l, "].pass.dy_fp8 and .gates must be the exchange's expert_dy codes and scales and "
                "expert_gates of local rank ", l, " (reverse_combine_fp8 fills them)");
  const GroupGemms routed = group_gemms<DxTiles>(pass, rank.weights, rows, /*dx_stored=*/false);
  FusedBackwardRankParams<Gemms> r{};
  r.dgrad_mainloop = routed.dgrad_mainloop;
  r.dgrad_epilogue = routed.dgrad_epilogue;
  r.dx_mainloop = routed.dx_mainloop;
  r.dx_epilogue = {rows.rows, world.device_heap_table(), exchange.backward_buffers().dx_slots, pass.hidden,
                   world.first_local_rank() + l, nullptr};
  r.tiles.dgrad = routed.dgrad_tiles;
  r.tiles.dx = routed.dx_tiles;
  r.tiles.group_dx = false;  // no ring of expert_dx rows: a dx row per route goes home
  r.tiles.has_shared = rank.has_shared;
  if (rank.has_shared) {
    CARACAL_CHECK(rank.shared.rows.num_experts == 1, kName, ": ranks[", l, "].shared must hold one expert, got ",
                  rank.shared.rows.num_experts);
    const int buffer_rows = rank.shared.rows.buffer_rows();
    CARACAL_CHECK(rank.shared_dx_rows >= 1 && rank.shared_dx_rows <= buffer_rows, kName, ": ranks[", l,
                  "].shared_dx_rows must be in [1, ", buffer_rows, "], got ", rank.shared_dx_rows);
    CARACAL_CHECK(rank.shared.dx != rank.shared.x, kName, ": ranks[", l,
                  "].shared.dx must not be shared.x (the shared expert's weight gradients read x after the launch)");
    const GroupGemms shared =
        group_gemms<SharedDxTiles>(rank.shared, rank.shared_weights, whole_schedule(rank.shared, "shared", l),
                                   /*dx_stored=*/true);
    r.shared_dgrad_mainloop = shared.dgrad_mainloop;
    r.shared_dgrad_epilogue = shared.dgrad_epilogue;
    r.shared_dx_mainloop = shared.dx_mainloop;
    // TMA stores no row past the map's: the padding rows' dx is not written.
    r.shared_dx_epilogue =
        gemm::rows_epilogue_params(rank.shared.dx, uint64_t(rank.shared_dx_rows), rank.shared.hidden, "shared dx");
    r.tiles.shared_dgrad = shared.dgrad_tiles;
    r.tiles.shared_dx = shared.dx_tiles;
  }
  place_backward_counters(r, rank.ready_counters, rows.row_capacity, shared_rows_of(rank), stream, kName);
  return r;
}

}  // namespace

size_t backward_fp8_ready_counter_words(int row_capacity, int shared_rows) {
  return backward_counter_words<Gemms>(row_capacity, shared_rows);
}

int fused_backward_fp8_ctas_per_rank(const comm::World& world) { return backward_ctas_per_rank<Gemms>(world, kName); }

void fused_backward(comm::World& world, const FusedBackwardFp8Args& args, cudaStream_t stream) {
  CARACAL_CHECK(args.exchange != nullptr, kName, ": exchange must not be null");
  const transfer::TokenExchange& exchange = *args.exchange;
  const int local_ranks = world.local_ranks();
  CARACAL_CHECK(local_ranks <= Gemms::kMaxLocalRanks, kName, ": at most ", Gemms::kMaxLocalRanks,
                " local ranks (the kernel's parameters hold each rank's GEMM descriptors), got ", local_ranks);
  CARACAL_CHECK(static_cast<int>(args.ranks.size()) == local_ranks, kName, ": ranks must hold one entry per local rank (",
                local_ranks, "), got ", args.ranks.size());
  CARACAL_CHECK(exchange.options().fp8_reverse_combine, kName,
                ": the exchange must pull dy in e4m3 (ExchangeOptions::fp8_reverse_combine)");
  const transfer::detail::ExchangeArgs& ex = transfer::ExchangeInternals::kernel_args(exchange);
  CARACAL_CHECK(ex.schedule.tile_m == gemm::kBlockM, kName, ": the exchange's tile_m must be ", gemm::kBlockM, ", got ",
                ex.schedule.tile_m);
  const comm::LaunchShape shape = fused_launch_shape<Policy>(fused_backward_fp8_ctas_per_rank(world), kName);
  const int comm_ctas = checked_comm_ctas(args.comm_ctas == 0 ? 1 : args.comm_ctas, shape, kName);

  BackwardKernelParams<Gemms> p{};
  for (int l = 0; l < local_ranks; ++l) p.ranks[l] = rank_params(world, exchange, l, args.ranks[size_t(l)], stream);
  p.schedule = ex.schedule;
  p.dy_pull = transfer::fp8_dy_pull_rows(ex);
  p.comm_ctas = comm_ctas;
  p.rows_per_route = ex.rows_per_route;
  launch_fused_backward(world, shape, p, args, stream, kName);
}

}  // namespace caracal::fused
