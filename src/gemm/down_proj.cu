// Forward down projection over expert-contiguous rows: DownProjGemm
// (device/gemm/expert_gemms/down_proj.cuh) in CTA pairs sharing an operand (the only kernel
// instantiated in this unit).
#include "caracal/gemm/grouped_gemm.hpp"
#include "device/gemm/expert_gemms/down_proj.cuh"
#include "device/gemm/paired_gemm_kernel.cuh"
#include "device/gemm/row_tile_pair_scheduler.cuh"
#include "gemm/forward_descriptors.cuh"
#include "gemm/host_checks.hpp"
#include "gemm/launch.cuh"

namespace caracal::gemm {

void grouped_down_proj(const DownProjArgs& args, cudaStream_t stream) {
  check_down_proj_args(args);
  if (args.rows.row_capacity == 0) return;

  using Kernel = ScheduledInPairs<DownProjGemm, RowTilePairScheduler>;
  const DownProjDescriptors g = down_proj_descriptors(args, uint64_t(args.rows.buffer_rows()));
  launch_grouped_gemm<Kernel>(params_of<Kernel>(g, g.epilogue), args.num_ctas, stream, "grouped_down_proj");
}

}  // namespace caracal::gemm
