// Backward step 3: the experts' weight gradients, dW[e] = sum over e's rows r of lhs[r]^T rhs[r]
// (the fp32 kernel is the only grouped-GEMM instantiation in this unit, launched once per
// gradient; gradients asked for in bf16 go to weight_grad_bf16.cu's kernel). The K loop of a tile
// runs over the expert's rows [expert_offset[e], + count) in kBlockK-row steps (its policy's),
// bounds read on the device (WeightGradGemm, device/gemm/expert_gemms/weight_grad.cuh: both
// operands MN-major row buffers).
#include <cuda_runtime.h>

#include <type_traits>

#include "caracal/error.hpp"
#include "caracal/gemm/grouped_gemm_backward.hpp"
#include "gemm/host_checks.hpp"
#include "gemm/launch.cuh"
#include "gemm/operand_maps.hpp"
#include "gemm/tensor_map.hpp"
#include "gemm/weight_grad_kernels.cuh"
#include "gemm/weight_grad_launch.hpp"

namespace caracal::gemm {
namespace {

// grad[e] ([L][m][n], fp32 `grad` or bf16 `grad_bf16`) = sum over e's rows of lhs[r]^T rhs[r];
// lhs [buffer rows][m], rhs [buffer rows][n]; bf16 partial sums (WeightGradArgs) in `partial_in`,
// `partial_out` ([m][n] fp32).
// With `gate_up` (dW_gate_up's launch), grad stored through its gate/up view in `layout`'s row order.
WeightGradLaunch make_weight_grad_launch(const ScheduleView& rows, const __nv_bfloat16* lhs, int m,
                                         const char* lhs_name, const __nv_bfloat16* rhs, int n, const char* rhs_name,
                                         float* grad, __nv_bfloat16* grad_bf16, const char* grad_name,
                                         const float* partial_in, float* partial_out, int num_ctas,
                                         bool gate_up = false, GateUpLayout layout = GateUpLayout::kInterleaved) {
  uint64_t const buffer_rows = uint64_t(rows.buffer_rows());
  uint64_t const grad_rows = uint64_t(rows.num_experts) * uint64_t(m);
  using Policy = WeightGradGemm::Policy;  // the bf16 gradients' GEMM's too
  static_assert(std::is_same_v<Policy, WeightGradBf16Gemm::Policy>);
  WeightGradLaunch launch;
  launch.num_ctas = num_ctas;
  WeightGradParams& p = launch.params;
  p.mainloop.a = OperandMaps<WeightGradGemm::OperandA>::make_map<Policy::A>(lhs, buffer_rows, uint64_t(m), lhs_name);
  p.mainloop.b = OperandMaps<WeightGradGemm::OperandB>::make_map<Policy::B>(rhs, buffer_rows, uint64_t(n), rhs_name);
  p.mainloop.a_mn_extent = m;
  p.mainloop.b_mn_extent = n;
  p.scheduler = {rows, (m + Policy::kBlockM - 1) / Policy::kBlockM, (n + Policy::kBlockN - 1) / Policy::kBlockN, m};
  WeightGradEpilogueParams& e = p.epilogue;
  e.grad_rows = m;
  e.grad_cols = n;
  // dW_gate_up in halves goes through the view; the interleaved order keeps the plain 2-D map.
  e.grad_view = gate_up && layout == GateUpLayout::kHalves;
  e.partial_in_halves = 0;
  uint64_t const experts = uint64_t(rows.num_experts);
  constexpr uint32_t kSliceGroups = kChunkRows / (2 * kGateUpInterleave);
  if (grad_bf16 != nullptr) {
    launch.bf16 = true;
    e.grad = e.grad_view ? make_gate_up_view_map(grad_bf16, experts, uint64_t(m / 2), uint64_t(n), layout,
                                                 kSliceGroups, kChunkCols, grad_name)
                         : make_tensor_map_2d(grad_bf16, grad_rows, uint64_t(n), kChunkRows, kChunkCols, grad_name);
    e.partial_in = partial_in;
    e.partial_in_expert_floats = 0;  // one expert's partial
    if (partial_out != nullptr) {
      e.partial_out = make_f32_tensor_map_2d(partial_out, uint64_t(m), uint64_t(n), kChunkRows, kChunkCols / 2,
                                             "partial_out");
    }
    e.partial_out_expert_rows = 0;
    return launch;
  }
  e.grad = e.grad_view ? make_f32_gate_up_view_map(grad, experts, uint64_t(m / 2), uint64_t(n), layout, kSliceGroups,
                                                    kChunkCols / 2, grad_name)
                       : make_f32_tensor_map_2d(grad, grad_rows, uint64_t(n), kChunkRows, kChunkCols / 2, grad_name);
  e.partial_out = e.grad;  // the fp32 gradient holds its own partial sums (stored as the gradient is)
  e.partial_out_expert_rows = m;
  e.partial_in = grad;
  e.partial_in_halves = e.grad_view ? m / 2 : 0;
  e.partial_in_expert_floats = int64_t(m) * n;
  return launch;
}

// Sets `count` gradient elements to zero, in whichever of the two dtypes was given.
void zero_gradient(float* grad, __nv_bfloat16* grad_bf16, size_t count, cudaStream_t stream) {
  cudaError_t const err = grad != nullptr ? cudaMemsetAsync(grad, 0, count * sizeof(float), stream)
                                          : cudaMemsetAsync(grad_bf16, 0, count * sizeof(__nv_bfloat16), stream);
  CARACAL_CHECK(err == cudaSuccess, "grouped_weight_grads: cannot zero the gradients: ", cudaGetErrorString(err));
}

}  // namespace

size_t weight_grad_partial_floats(int hidden, int intermediate) {
  if (hidden <= 0 || intermediate <= 0) return 0;
  return 3 * size_t(hidden) * size_t(intermediate);
}

std::array<WeightGradLaunch, 2> weight_grad_launches(const WeightGradArgs& args) {
  // The partials: dW_gate_up's, then dW_down's.
  size_t const down_at = 2 * size_t(args.hidden) * size_t(args.intermediate);
  const float* in_down = args.partial_in != nullptr ? args.partial_in + down_at : nullptr;
  float* out_down = args.partial_out != nullptr ? args.partial_out + down_at : nullptr;
  return {
      // dW_gate_up[e] = d_gate_up^T x: [2I][D], its rows in W_gate_up's order.
      make_weight_grad_launch(args.rows, args.d_gate_up, 2 * args.intermediate, "d_gate_up", args.x, args.hidden, "x",
                              args.d_w_gate_up, args.d_w_gate_up_bf16, "d_w_gate_up", args.partial_in,
                              args.partial_out, args.num_ctas, true, args.d_w_gate_up_layout),
      // dW_down[e] = dy^T (g hidden): [D][I].
      make_weight_grad_launch(args.rows, args.dy, args.hidden, "dy", args.scaled_activation, args.intermediate,
                              "scaled_activation", args.d_w_down, args.d_w_down_bf16, "d_w_down", in_down, out_down,
                              args.num_ctas)};
}

void launch_weight_grad(const WeightGradLaunch& launch, cudaStream_t stream) {
  if (launch.bf16) {
    launch_weight_grad_bf16(launch.params, launch.num_ctas, stream);
  } else {
    launch_grouped_gemm<WeightGradKernel>(launch.params, launch.num_ctas, stream, "grouped_weight_grads");
  }
}

void grouped_weight_grads(const WeightGradArgs& args, cudaStream_t stream) {
  gemm::check_weight_grads_args(args);
  if (args.rows.row_capacity == 0) {  // no rows at all: every gradient is zero
    size_t const experts = size_t(args.rows.num_experts);
    size_t const di = size_t(args.hidden) * size_t(args.intermediate);
    zero_gradient(args.d_w_gate_up, args.d_w_gate_up_bf16, experts * 2 * di, stream);
    zero_gradient(args.d_w_down, args.d_w_down_bf16, experts * di, stream);
    return;
  }
  for (const WeightGradLaunch& launch : weight_grad_launches(args)) launch_weight_grad(launch, stream);
}

}  // namespace caracal::gemm
