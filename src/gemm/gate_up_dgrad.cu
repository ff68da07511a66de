// Backward step 2 over expert-contiguous rows: dx = d_gate_up · W_gate_up[e], its rows stored as
// they are, GateUpDgradGemm (device/gemm/expert_gemms/gate_up_dgrad.cuh) in CTA pairs sharing an
// operand (the only grouped-GEMM instantiation in this unit).
#include "caracal/gemm/grouped_gemm_backward.hpp"
#include "device/gemm/expert_gemms/gate_up_dgrad.cuh"
#include "device/gemm/paired_gemm_kernel.cuh"
#include "device/gemm/row_tile_pair_scheduler.cuh"
#include "gemm/backward_descriptors.cuh"
#include "gemm/epilogue_params.hpp"
#include "gemm/host_checks.hpp"
#include "gemm/launch.cuh"

namespace caracal::gemm {

void grouped_gate_up_dgrad(const GateUpDgradArgs& args, cudaStream_t stream) {
  check_gate_up_dgrad_args(args);
  if (args.rows.row_capacity == 0) return;

  using Kernel = ScheduledInPairs<GateUpDgradGemm, RowTilePairScheduler>;
  const GateUpDgradDescriptors g = gate_up_dgrad_descriptors(args);
  const RowsBf16Epilogue::Params dx_out =
      rows_epilogue_params(args.dx_out, uint64_t(args.rows.buffer_rows()), args.hidden, "dx_out");
  launch_grouped_gemm<Kernel>(params_of<Kernel>(g, dx_out), args.num_ctas, stream, "grouped_gate_up_dgrad");
}

}  // namespace caracal::gemm
