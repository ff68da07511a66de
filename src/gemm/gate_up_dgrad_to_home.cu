// gemm::gate_up_dgrad_to_home (gate_up_dgrad_to_home.hpp): GateUpDgradToHomeGemm
// (device/gemm/expert_gemms/gate_up_dgrad_to_home.cuh), one CTA a tile (the only kernel
// instantiated in this unit).
#include "caracal/error.hpp"
#include "device/gemm/expert_gemms/gate_up_dgrad_to_home.cuh"
#include "device/gemm/grouped_gemm_kernel.cuh"
#include "device/gemm/row_tile_scheduler.cuh"
#include "gemm/backward_descriptors.cuh"
#include "gemm/gate_up_dgrad_to_home.hpp"
#include "gemm/host_checks.hpp"
#include "gemm/launch.cuh"

namespace caracal::gemm {
namespace {

using GateUpDgradToHomeKernel = Scheduled<GateUpDgradToHomeGemm, RowTileScheduler>;

constexpr const char* kName = "gate_up_dgrad_to_home";

}  // namespace

void gate_up_dgrad_to_home(const ExpertPass& pass, const ExpertPassWeights& weights, const HomeSlots& home,
                           cudaStream_t stream) {
  CARACAL_CHECK(pass.rows.rows != nullptr, kName, ": pass.rows.rows must name each row's home (the schedule's rows)");
  CARACAL_CHECK(home.heaps != nullptr, kName, ": home.heaps must not be null");
  GateUpDgradArgs args = dx_gemm_args(pass, weights);
  args.dx_out = nullptr;  // the rows go to their home slots
  check_gate_up_dgrad_args(args, /*dx_stored=*/false);
  if (args.rows.row_capacity == 0) return;

  const GateUpDgradDescriptors g = gate_up_dgrad_descriptors(args);
  launch_grouped_gemm<GateUpDgradToHomeKernel>(
      params_of<GateUpDgradToHomeKernel>(
          g, {pass.rows.rows, home.heaps, home.slots, pass.hidden, home.rank, /*group_rows=*/nullptr}),
      args.num_ctas, stream, kName);
}

}  // namespace caracal::gemm
