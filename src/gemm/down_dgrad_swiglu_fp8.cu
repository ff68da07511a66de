// Backward step 1 in FP8: Fp8DownDgradSwigluGemm (device/gemm/expert_gemms/down_dgrad_swiglu_fp8.cuh),
// one CTA a 128 x 128 tile (the only grouped-GEMM instantiation in this unit), then the fixed-order
// reduction of the router-score partials.
#include "caracal/gemm/grouped_gemm_backward_fp8.hpp"
#include "device/gemm/expert_gemms/down_dgrad_swiglu_fp8.cuh"
#include "device/gemm/grouped_gemm_kernel.cuh"
#include "gemm/backward_descriptors.cuh"
#include "gemm/fp8_descriptors.hpp"
#include "gemm/host_checks.hpp"
#include "gemm/launch.cuh"
#include "gemm/router_grad_reduce.hpp"
#include "gemm/tensor_map.hpp"

namespace caracal::gemm {
namespace {

using Policy = Fp8DownDgradSwigluGemm::Policy;
using Fp8DownDgradSwigluKernel = Scheduled<Fp8DownDgradSwigluGemm, RowTileSchedulerOf<Policy::kBlockN>>;

}  // namespace

size_t fp8_down_dgrad_workspace_floats(int row_capacity, int intermediate) {
  if (row_capacity <= 0 || intermediate <= 0) return 0;
  return size_t(row_capacity) * size_t((intermediate + Policy::kBlockN - 1) / Policy::kBlockN);
}

void grouped_down_dgrad_swiglu(const Fp8DownDgradSwigluArgs& args, cudaStream_t stream) {
  using Gemm = Fp8DownDgradSwigluKernel;
  const char* fn = "grouped_down_dgrad_swiglu (fp8)";
  check_down_dgrad_swiglu_args(args);
  if (args.rows.row_capacity == 0) return;

  const uint64_t rows = uint64_t(args.rows.buffer_rows());
  const uint64_t d = uint64_t(args.hidden), i = uint64_t(args.intermediate);
  GemmParams<Gemm> p = fp8_row_gemm_params<Gemm>(args.rows, args.dy, args.w_down_t, i, d, "dy", "w_down_t", args.tile_queue);
  p.epilogue.swiglu =
      swiglu_backward_params(args.rows, args.intermediate, args.gate_up, args.gates, args.d_gate_up_out,
                             args.scaled_activation_out, args.workspace, p.scheduler.n_blocks);
  p.epilogue.d_gate_up_codes = make_tensor_map_2d(args.d_gate_up_fp8_out.codes, rows, 2 * i, kChunkRows,
                                                  kScaleBlock, "d_gate_up_fp8_out.codes", TensorElement::kE4m3);
  p.epilogue.d_gate_up_scales = args.d_gate_up_fp8_out.scales;
  p.epilogue.buffer_rows = int(rows);
  launch_grouped_gemm<Gemm>(p, args.num_ctas, stream, fn);
  reduce_router_grad(args.workspace, p.scheduler.n_blocks, args.rows, args.d_gates_out, stream, fn);
}

}  // namespace caracal::gemm
