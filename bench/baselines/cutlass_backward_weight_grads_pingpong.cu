// The CUTLASS bf16 weight-gradient baseline (both operands MN-major, fp32 out), ping-pong schedule.
#include "cutlass_backward_gemms.cuh"

namespace caracal::bench {

std::unique_ptr<CutlassGroupedGemm> make_cutlass_weight_grads_pingpong(const CutlassWeightGradProblem& problem) {
  using Runner = cutlass_backward::Bf16Runner<cutlass_backward::Bf16Pingpong, cutlass::layout::ColumnMajor,
                                              cutlass::layout::RowMajor, float>;
  return std::make_unique<Runner>(cutlass_backward::weight_grad_groups<cutlass::bfloat16_t>(problem));
}

}  // namespace caracal::bench
