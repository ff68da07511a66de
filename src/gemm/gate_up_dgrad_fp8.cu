// Backward step 2 in FP8: dx = d_gate_up · W_gate_up[e], its rows stored as they are,
// Fp8GateUpDgradGemm (device/gemm/expert_gemms/gate_up_dgrad_fp8.cuh), one CTA a 128 x 256 tile
// (the only kernel instantiated in this unit).
#include "caracal/gemm/grouped_gemm_backward_fp8.hpp"
#include "device/gemm/expert_gemms/gate_up_dgrad_fp8.cuh"
#include "device/gemm/grouped_gemm_kernel.cuh"
#include "gemm/epilogue_params.hpp"
#include "gemm/fp8_descriptors.hpp"
#include "gemm/host_checks.hpp"
#include "gemm/launch.cuh"
#include "gemm/tensor_map.hpp"

namespace caracal::gemm {
namespace {

using Policy = Fp8GateUpDgradGemm::Policy;
using Fp8GateUpDgradKernel = Scheduled<Fp8GateUpDgradGemm, RowTileSchedulerOf<Policy::kBlockN>>;

}  // namespace

void grouped_gate_up_dgrad(const Fp8GateUpDgradArgs& args, cudaStream_t stream) {
  using Gemm = Fp8GateUpDgradKernel;
  check_gate_up_dgrad_args(args);
  if (args.rows.row_capacity == 0) return;

  const uint64_t rows = uint64_t(args.rows.buffer_rows());
  const uint64_t d = uint64_t(args.hidden), i = uint64_t(args.intermediate);
  GemmParams<Gemm> p = fp8_row_gemm_params<Gemm>(args.rows, args.d_gate_up, args.w_gate_up_t, d, 2 * i, "d_gate_up",
                                                 "w_gate_up_t", args.tile_queue);
  p.epilogue = rows_epilogue_params(args.dx_out, rows, args.hidden, "dx_out");
  launch_grouped_gemm<Gemm>(p, args.num_ctas, stream, "grouped_gate_up_dgrad (fp8)");
}

}  // namespace caracal::gemm
