// The fused forward in bf16 (src/fused/fused_forward.hpp): fused_forward_kernel<Bf16ForwardGemms>
// (forward_launch.cuh), the only kernel instantiated in this unit, on the standalone bf16 GEMMs'
// descriptors.
#include <algorithm>

#include "fused/forward_launch.cuh"
#include "gemm/forward_descriptors.cuh"
#include "gemm/host_checks.hpp"

namespace caracal::fused {
namespace {

constexpr const char* kName = "fused forward";

// One group of experts' GEMMs but the down epilogue: the standalone launchers' descriptors
// (gemm/forward_descriptors.cuh) over `pass`'s rows, the row buffers' maps over the rows they hold
// (ring_rows of the ring, else the row capacity), pass.out's too.
GroupGemms<Bf16ForwardGemms> expert_gemms(const gemm::ExpertPass& pass, const gemm::ExpertPassWeights& weights,
                                          uint32_t* activation_ready) {
  using namespace gemm;
  check_forward_pass(pass, kName);
  const ScheduleView& schedule = pass.rows;
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
  GroupGemms<Bf16ForwardGemms> g{};
  g.gemms.up_mainloop = u.mainloop;
  g.gemms.up_epilogue = u.epilogue;
  g.gemms.down_mainloop = d.mainloop;
  g.gemms.tiles = {u.tiles, d.tiles};
  g.gemms.activation_ready = activation_ready;
  g.out = d.epilogue;
  return g;
}

}  // namespace

size_t ready_counter_words(int row_capacity, int shared_rows) {
  static_assert(!Bf16ForwardGemms::TaskHandOff::kReadsTaskTable, "the bf16 launch reads no task table");
  return ForwardRankWords<Bf16ForwardGemms::Policy::kStages>(
             nullptr, ForwardCounters(nullptr, row_capacity, shared_rows).words, 0)
      .words;
}

int fused_ctas_per_rank(const comm::World& world) { return forward_ctas_per_rank<Bf16ForwardGemms>(world, kName); }

int default_comm_ctas(const comm::World& world) { return std::max(1, fused_ctas_per_rank(world) / 16); }

void zero_ready_counters(const FusedForwardArgs& args, cudaStream_t stream) {
  zero_forward_counters(args, stream, kName);
}

void fused_forward(comm::World& world, const FusedForwardArgs& args, cudaStream_t stream) {
  CARACAL_CHECK(args.exchange != nullptr, kName, ": exchange must not be null");
  const transfer::detail::ExchangeArgs& exchange = transfer::ExchangeInternals::kernel_args(*args.exchange);
  const transfer::PullRows pull{exchange.forward.x, exchange.forward.expert_x, {}, {}, exchange.top_k, exchange.hidden};
  launch_fused_forward<Bf16ForwardGemms>(world, args, pull, NoRowBases{}, expert_gemms, /*zero_padding_rows=*/false, stream, kName);
}

}  // namespace caracal::fused
