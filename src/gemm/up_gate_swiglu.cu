// Forward up/gate + SwiGLU over expert-contiguous rows: UpGateSwigluGemm
// (device/gemm/expert_gemms/up_gate_swiglu.cuh) in CTA pairs sharing an operand (the only kernel
// instantiated in this unit).
#include "caracal/gemm/grouped_gemm.hpp"
#include "device/gemm/expert_gemms/up_gate_swiglu.cuh"
#include "device/gemm/paired_gemm_kernel.cuh"
#include "device/gemm/row_tile_pair_scheduler.cuh"
#include "gemm/forward_descriptors.cuh"
#include "gemm/host_checks.hpp"
#include "gemm/launch.cuh"

namespace caracal::gemm {

void grouped_up_gate_swiglu(const UpGateSwigluArgs& args, cudaStream_t stream) {
  check_up_gate_swiglu_args(args);
  if (args.rows.row_capacity == 0) return;

  using Kernel = ScheduledInPairs<UpGateSwigluGemm, RowTilePairScheduler>;
  const UpGateSwigluDescriptors g = up_gate_swiglu_descriptors(args, uint64_t(args.rows.buffer_rows()));
  launch_grouped_gemm<Kernel>(params_of<Kernel>(g, g.epilogue), args.num_ctas, stream, "grouped_up_gate_swiglu");
}

}  // namespace caracal::gemm
