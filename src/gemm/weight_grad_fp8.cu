// Backward step 3 in FP8: the experts' weight gradients from rows quantized down their columns,
// Fp8WeightGradGemm (device/gemm/expert_gemms/weight_grad_fp8.cuh), one CTA a 128 x 128 tile of
// dW[e] (the fp32 kernel is the only instantiation in this unit, launched once per gradient;
// gradients asked for in bf16 go to weight_grad_fp8_bf16.cu's kernel). A tile's K loop runs over
// its expert's rows in 128-row steps, each one scaling block of both operands.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <utility>

#include "caracal/error.hpp"
#include "caracal/gemm/grouped_gemm_backward_fp8.hpp"
#include "gemm/host_checks.hpp"
#include "gemm/launch.cuh"
#include "gemm/operand_maps.hpp"
#include "gemm/tensor_map.hpp"
#include "gemm/weight_grad_fp8_kernels.cuh"

namespace caracal::gemm {
namespace {

using Policy = Fp8WeightGradGemm::Policy;

// grad[e] ([L][m][n], fp32 `grad` or bf16 `grad_bf16`) = sum over e's rows of lhs[r]^T rhs[r], lhs
// and rhs [buffer rows][m] and [buffer rows][n] quantized down their columns.
void launch_weight_grad(const ScheduleView& rows, const Fp8ColumnOperand& lhs, int m, const std::string& lhs_name,
                        const Fp8ColumnOperand& rhs, int n, const std::string& rhs_name, float* grad,
                        __nv_bfloat16* grad_bf16, const char* grad_name, int num_ctas, cudaStream_t stream) {
  using Maps = OperandMaps<KMajorRows>;  // both operands: [MN][buffer rows], K-major
  uint64_t const buffer_rows = uint64_t(rows.buffer_rows());
  uint64_t const grad_rows = uint64_t(rows.num_experts) * uint64_t(m);
  Fp8WeightGradParams p{};
  p.mainloop.a = Maps::make_map<Policy::A>(lhs.codes_t, uint64_t(m), buffer_rows, (lhs_name + ".codes_t").c_str());
  p.mainloop.b = Maps::make_map<Policy::B>(rhs.codes_t, uint64_t(n), buffer_rows, (rhs_name + ".codes_t").c_str());
  p.mainloop.scales_a =
      Maps::make_scale_map<Policy::A>(lhs.scales, uint64_t(m), buffer_rows, (lhs_name + ".scales").c_str());
  p.mainloop.scales_b =
      Maps::make_scale_map<Policy::B>(rhs.scales, uint64_t(n), buffer_rows, (rhs_name + ".scales").c_str());
  p.mainloop.a_mn_extent = m;
  p.mainloop.b_mn_extent = n;
  p.scheduler = {rows, (m + Policy::kBlockM - 1) / Policy::kBlockM, (n + Policy::kBlockN - 1) / Policy::kBlockN, m};
  // The whole schedule is one window: no sum starts from or stops at a partial (the partial fields
  // stay unset, never read).
  WeightGradEpilogueParams& e = p.epilogue;
  e.grad_rows = m;
  e.grad_cols = n;
  e.grad_view = false;
  e.partial_in_halves = 0;
  if (grad_bf16 != nullptr) {
    e.grad = make_tensor_map_2d(grad_bf16, grad_rows, uint64_t(n), kChunkRows, kChunkCols, grad_name);
    launch_fp8_weight_grad_bf16(p, num_ctas, stream);
    return;
  }
  e.grad = make_f32_tensor_map_2d(grad, grad_rows, uint64_t(n), kChunkRows, kChunkCols / 2, grad_name);
  launch_grouped_gemm<Fp8WeightGradKernel>(p, num_ctas, stream, "grouped_weight_grads (fp8)");
}

// Sets `count` gradient elements to zero, in whichever of the two dtypes was given.
void zero_gradient(float* grad, __nv_bfloat16* grad_bf16, size_t count, cudaStream_t stream) {
  cudaError_t const err = grad != nullptr ? cudaMemsetAsync(grad, 0, count * sizeof(float), stream)
                                          : cudaMemsetAsync(grad_bf16, 0, count * sizeof(__nv_bfloat16), stream);
  CARACAL_CHECK(err == cudaSuccess, "grouped_weight_grads (fp8): cannot zero the gradients: ", cudaGetErrorString(err));
}

}  // namespace

void grouped_weight_grads(const Fp8WeightGradArgs& args, cudaStream_t stream) {
  check_weight_grads_args(args);
  if (args.rows.row_capacity == 0) {  // no rows at all: every gradient is zero
    size_t const experts = size_t(args.rows.num_experts);
    size_t const di = size_t(args.hidden) * size_t(args.intermediate);
    zero_gradient(args.d_w_gate_up, args.d_w_gate_up_bf16, experts * 2 * di, stream);
    zero_gradient(args.d_w_down, args.d_w_down_bf16, experts * di, stream);
    return;
  }
  // dW_gate_up[e] = d_gate_up^T x: [2I][D], rows interleaved as d_gate_up's columns are.
  launch_weight_grad(args.rows, args.d_gate_up, 2 * args.intermediate, "d_gate_up", args.x, args.hidden, "x",
                     args.d_w_gate_up, args.d_w_gate_up_bf16, "d_w_gate_up", args.num_ctas, stream);
  // dW_down[e] = dy^T (g hidden): [D][I].
  launch_weight_grad(args.rows, args.dy, args.hidden, "dy", args.scaled_activation, args.intermediate,
                     "scaled_activation", args.d_w_down, args.d_w_down_bf16, "d_w_down", args.num_ctas, stream);
}

}  // namespace caracal::gemm
