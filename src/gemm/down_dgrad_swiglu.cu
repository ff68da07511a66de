// Backward step 1 over expert-contiguous rows: the down projection's dgrad with the SwiGLU-backward
// + router-score epilogue, DownDgradSwigluGemm (device/gemm/expert_gemms/down_dgrad_swiglu.cuh) in
// CTA pairs sharing an operand (the only grouped-GEMM instantiation in this unit), then the
// fixed-order reduction of the router-score partials.
#include "caracal/gemm/grouped_gemm_backward.hpp"
#include "device/gemm/expert_gemms/down_dgrad_swiglu.cuh"
#include "device/gemm/paired_gemm_kernel.cuh"
#include "device/gemm/row_tile_pair_scheduler.cuh"
#include "gemm/backward_descriptors.cuh"
#include "gemm/host_checks.hpp"
#include "gemm/launch.cuh"
#include "gemm/router_grad_reduce.hpp"

namespace caracal::gemm {
namespace {

using DownDgradSwigluKernel = ScheduledInPairs<DownDgradSwigluGemm, RowTilePairScheduler>;

int intermediate_blocks(int intermediate) {
  return (intermediate + gemm::kBlockN - 1) / gemm::kBlockN;
}

}  // namespace

size_t down_dgrad_workspace_floats(int row_capacity, int intermediate) {
  if (row_capacity <= 0 || intermediate <= 0) return 0;
  return size_t(row_capacity) * size_t(intermediate_blocks(intermediate));
}

void grouped_down_dgrad_swiglu(const DownDgradSwigluArgs& args, cudaStream_t stream) {
  const char* fn = "grouped_down_dgrad_swiglu";
  check_down_dgrad_swiglu_args(args);
  if (args.rows.row_capacity == 0) return;

  const DownDgradSwigluDescriptors g = down_dgrad_swiglu_descriptors(args);
  launch_grouped_gemm<DownDgradSwigluKernel>(params_of<DownDgradSwigluKernel>(g, g.epilogue), args.num_ctas, stream, fn);
  reduce_router_grad(args.workspace, g.tiles.n_blocks, args.rows, args.d_gates_out, stream, fn);
}

}  // namespace caracal::gemm
