// The dx GEMM whose epilogue stores each row into its home slot (src/fused/dx_to_home.hpp):
// GateUpDgradToHomeGemm (device/gemm/expert_gemms/gate_up_dgrad_to_home.cuh), one CTA a tile (the
// only kernel instantiated in this unit).
#include "caracal/error.hpp"
#include "device/gemm/expert_gemms/gate_up_dgrad_to_home.cuh"
#include "device/gemm/grouped_gemm_kernel.cuh"
#include "device/gemm/row_tile_scheduler.cuh"
#include "fused/dx_to_home.hpp"
#include "gemm/backward_descriptors.cuh"
#include "gemm/host_checks.hpp"
#include "gemm/launch.cuh"

namespace caracal::fused {
namespace {

using GateUpDgradToHomeKernel = gemm::Scheduled<gemm::GateUpDgradToHomeGemm, gemm::RowTileScheduler>;

constexpr const char* kName = "gate_up_dgrad_to_home";

}  // namespace

void gate_up_dgrad_to_home(const comm::World& world, const transfer::TokenExchange& exchange, int local_rank,
                           const gemm::ExpertPass& pass, const gemm::ExpertPassWeights& weights, cudaStream_t stream) {
  CARACAL_CHECK(local_rank >= 0 && local_rank < world.local_ranks(), kName, ": local_rank must be in [0, ",
                world.local_ranks(), "), got ", local_rank);
  const ScheduleView view = exchange.schedule_view(local_rank);
  CARACAL_CHECK(pass.rows.rows == view.rows && pass.rows.expert_offset == view.expert_offset, kName,
                ": pass.rows must be the exchange's schedule view of local rank ", local_rank,
                " (the rows name the home slots)");
  CARACAL_CHECK(exchange.options().backward, kName, ": the exchange needs ExchangeOptions::backward = true");
  gemm::GateUpDgradArgs args = gemm::dx_gemm_args(pass, weights);
  args.dx_out = nullptr;  // the rows go to their home slots
  gemm::check_gate_up_dgrad_args(args, /*dx_stored=*/false);
  if (args.rows.row_capacity == 0) return;

  const gemm::GateUpDgradDescriptors g = gemm::gate_up_dgrad_descriptors(args);
  gemm::GemmParams<GateUpDgradToHomeKernel> p{};
  p.mainloop = g.mainloop;
  p.scheduler = g.tiles;
  p.epilogue = {pass.rows.rows, world.device_heap_table(), exchange.backward_buffers().dx_slots, pass.hidden,
                world.first_local_rank() + local_rank, /*group_rows=*/nullptr};
  gemm::launch_grouped_gemm<GateUpDgradToHomeKernel>(p, args.num_ctas, stream, kName);
}

}  // namespace caracal::fused
