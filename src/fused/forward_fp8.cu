// The fused forward in FP8 (src/fused/fused_forward.hpp, FusedForwardFp8Args):
// fused_forward_kernel<Fp8ForwardGemms> (forward_launch.cuh), the only kernel instantiated in this
// unit, on the standalone FP8 GEMMs' descriptors (gemm/fp8_descriptors.hpp).
#include "device/gemm/grouped_gemm_kernel.cuh"
#include "fused/forward_launch.cuh"
#include "gemm/epilogue_params.hpp"
#include "gemm/fp8_descriptors.hpp"
#include "gemm/host_checks.hpp"
#include "gemm/up_gate_swiglu_fp8_launch.cuh"

namespace caracal::fused {
namespace {

constexpr const char* kName = "fused forward (fp8)";

using Policy = Fp8ForwardGemms::Policy;
using UpGateTiles = gemm::Scheduled<Fp8ForwardGemms::UpGate, gemm::RowTileSchedulerOf<Policy::kBlockN>>;
using DownTiles = gemm::Scheduled<Fp8ForwardGemms::Down, gemm::RowTileSchedulerOf<Policy::kBlockN>>;

// One group of experts' GEMMs but the down epilogue, as expert_gemms of forward.cu: the standalone
// FP8 launchers' descriptors over `pass`'s rows, the row buffers' maps over the rows they hold.
GroupGemms<Fp8ForwardGemms> expert_gemms(const gemm::Fp8ExpertPass& pass, const gemm::Fp8ExpertWeights& weights,
                                         uint32_t* activation_ready) {
  using namespace gemm;
  check_forward_pass(pass, kName);
  static_assert(!Fp8ForwardGemms::kSumsGroupsInLaunch);
  CARACAL_CHECK(pass.rows.ring_rows == 0, kName, ": rows.ring_rows must be 0 (the FP8 launch walks the schedule in "
                "one macrobatch: its consumers run no group sums), got ", pass.rows.ring_rows);
  CARACAL_CHECK(pass.x_tokens.codes == nullptr, kName, ": pass.x_tokens must be null (the launch reads the tokens' "
                "home codes through the exchange, the ring's rows through pass.x_fp8)");
  const ScheduleView& schedule = pass.rows;
  // The launch takes its tiles from the rank's task counter: no tile queue, no CTA count.
  Fp8UpGateSwigluArgs up = up_gate_gemm_args(pass, weights);
  up.rows.ring_rows = 0;  // the standalone checks take a ring in windows; this launch walks all of it
  up.num_ctas = 0;
  up.tile_queue = nullptr;
  check_up_gate_swiglu_args(up);
  Fp8DownProjArgs down = down_gemm_args(pass, weights);
  down.rows = up.rows;
  down.num_ctas = 0;
  down.tile_queue = nullptr;
  check_down_proj_args(down);

  up.rows = schedule;  // the tiles walk the ring's schedule; every map spans its buffer rows
  const uint64_t d = uint64_t(pass.hidden), i = uint64_t(pass.intermediate);
  const GemmParams<UpGateTiles> u =
      fp8_row_gemm_params<UpGateTiles>(schedule, up.x, up.w_gate_up, 2 * i, d, "x_fp8", "w_gate_up", nullptr);
  const GemmParams<DownTiles> dn =
      fp8_row_gemm_params<DownTiles>(schedule, down.activation, down.w_down, d, i, "activation_fp8", "w_down", nullptr);
  GroupGemms<Fp8ForwardGemms> g{};
  g.gemms.up_mainloop = u.mainloop;
  g.gemms.up_epilogue = up_gate_fp8_epilogue(up);
  g.gemms.down_mainloop = dn.mainloop;
  g.gemms.tiles = {u.scheduler, dn.scheduler};
  g.gemms.activation_ready = activation_ready;
  g.out = rows_epilogue_params(pass.out, uint64_t(schedule.buffer_rows()), pass.hidden, "out");
  return g;
}

}  // namespace

size_t fp8_ready_counter_words(int row_capacity, int shared_rows, int hidden, int intermediate) {
  static_assert(Fp8ForwardGemms::TaskHandOff::kReadsTaskTable, "the FP8 launch reads the task table");
  return ForwardRankWords<Policy::kStages>(nullptr, ForwardCounters(nullptr, row_capacity, shared_rows).words,
                                           forward_task_table_entries_of_shape(row_capacity, hidden, intermediate))
      .words;
}

int fused_fp8_ctas_per_rank(const comm::World& world) { return forward_ctas_per_rank<Fp8ForwardGemms>(world, kName); }

void zero_ready_counters(const FusedForwardFp8Args& args, cudaStream_t stream) {
  zero_forward_counters(args, stream, kName);
}

void fused_forward(comm::World& world, const FusedForwardFp8Args& args, cudaStream_t stream) {
  CARACAL_CHECK(args.exchange != nullptr, kName, ": exchange must not be null");
  CARACAL_CHECK(args.exchange->options().fp8_dispatch, kName,
                ": the exchange must hold x in e4m3 (ExchangeOptions::fp8_dispatch)");
  const transfer::detail::ExchangeArgs& exchange = transfer::ExchangeInternals::kernel_args(*args.exchange);
  const transfer::PullFp8Rows pull = transfer::fp8_pull_rows(exchange);
  CARACAL_CHECK(world.local_ranks() <= kFusedFp8MaxLocalRanks, kName, ": at most ", kFusedFp8MaxLocalRanks,
                " local ranks, got ", world.local_ranks());
  // The producer holds a gathered row as the 32-bit byte offset of its codes (Fp8ForwardGemms::RowRefs).
  const uint64_t row_bytes = uint64_t(pull.hidden), offset_limit = uint64_t(1) << 32;
  CARACAL_CHECK(uint64_t(pull.home_rows) * row_bytes < offset_limit, kName,
                ": x's e4m3 rows at home must take less than 4 GiB (home rows x hidden), got ", pull.home_rows, " x ",
                pull.hidden);
  CARACAL_CHECK(uint64_t(pull.scale_stride) * row_bytes < offset_limit, kName,
                ": the expert rows' e4m3 codes must take less than 4 GiB (buffer rows x hidden), got ",
                pull.scale_stride, " x ", pull.hidden);
  Fp8RowBases bases{};
  for (int l = 0; l < world.local_ranks(); ++l) {
    bases.home_codes[l] = reinterpret_cast<const uint8_t*>(world.local_pointer(pull.home_codes, l));
    bases.home_scales[l] = world.local_pointer(pull.home_scales, l);
    bases.ring_codes[l] = reinterpret_cast<const uint8_t*>(world.local_pointer(pull.expert_codes, l));
    bases.ring_scales[l] = world.local_pointer(pull.expert_scales, l);
  }
  // Pulling every row, it leaves expert_x_codes as dispatch_fp8 does, padding rows included.
  launch_fused_forward<Fp8ForwardGemms>(world, args, pull, bases, expert_gemms,
                                        /*zero_padding_rows=*/args.pull_all_rows, stream, kName);
}

}  // namespace caracal::fused
