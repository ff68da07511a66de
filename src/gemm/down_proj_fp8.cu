// Forward down projection in FP8: Fp8DownProjGemm (device/gemm/expert_gemms/down_proj_fp8.cuh), one
// CTA a 128 x 256 tile (the only kernel instantiated in this unit).
#include "caracal/gemm/grouped_gemm_fp8.hpp"
#include "device/gemm/expert_gemms/down_proj_fp8.cuh"
#include "device/gemm/grouped_gemm_kernel.cuh"
#include "gemm/epilogue_params.hpp"
#include "gemm/fp8_descriptors.hpp"
#include "gemm/host_checks.hpp"
#include "gemm/launch.cuh"
#include "gemm/tensor_map.hpp"

namespace caracal::gemm {
namespace {

using Policy = Fp8DownProjGemm::Policy;
using Fp8DownProjKernel = Scheduled<Fp8DownProjGemm, RowTileSchedulerOf<Policy::kBlockN>>;

}  // namespace

void grouped_down_proj(const Fp8DownProjArgs& args, cudaStream_t stream) {
  using Gemm = Fp8DownProjKernel;
  check_down_proj_args(args);
  if (args.rows.row_capacity == 0) return;

  const uint64_t rows = uint64_t(args.rows.buffer_rows());
  const uint64_t d = uint64_t(args.hidden), i = uint64_t(args.intermediate);
  GemmParams<Gemm> p =
      fp8_row_gemm_params<Gemm>(args.rows, args.activation, args.w_down, d, i, "activation", "w_down", args.tile_queue);
  p.epilogue = rows_epilogue_params(args.y_out, rows, args.hidden, "y_out");
  launch_grouped_gemm<Gemm>(p, args.num_ctas, stream, "grouped_down_proj (fp8)");
}

}  // namespace caracal::gemm
