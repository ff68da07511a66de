// The CUTLASS FP8 weight-gradient baseline (blockwise 1 x 1 x 128 scales, fp32 out), ping-pong schedule.
#include "cutlass_backward_gemms.cuh"

namespace caracal::bench {

std::unique_ptr<CutlassGroupedGemm> make_cutlass_fp8_weight_grads_pingpong(const CutlassFp8WeightGradProblem& problem) {
  using Runner = cutlass_backward::Fp8WeightGradRunner<cutlass_backward::Fp8Pingpong>;
  return std::make_unique<Runner>(cutlass_backward::fp8_weight_grad_groups<cutlass::float_e4m3_t>(problem));
}

}  // namespace caracal::bench
