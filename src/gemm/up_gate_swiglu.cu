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
namespace {

using UpGateSwigluKernel = ScheduledInPairs<UpGateSwigluGemm, RowTilePairScheduler>;

}  // namespace

void grouped_up_gate_swiglu(const UpGateSwigluArgs& args, cudaStream_t stream) {
  using namespace gemm;
  check_up_gate_swiglu_args(args);
  if (args.rows.row_capacity == 0) return;

  const UpGateSwigluDescriptors g = up_gate_swiglu_descriptors(args, uint64_t(args.rows.buffer_rows()));
  launch_grouped_gemm<UpGateSwigluKernel>(params_of<UpGateSwigluKernel>(g, g.epilogue), args.num_ctas, stream,
                                          "grouped_up_gate_swiglu");
}

}  // namespace caracal::gemm
