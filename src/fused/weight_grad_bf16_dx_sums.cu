// The bf16 weight-gradient kernel with the reverse dispatch's sums on its idle warps
// (weight_grad_dx_sums.cuh; the only kernel instantiated in this unit).
#include "gemm/launch.cuh"
#include "fused/weight_grad_dx_sums.cuh"

namespace caracal::fused {

void launch_weight_grad_bf16_dx_sums(const WeightGradDxSumsParams& p, int num_ctas, cudaStream_t stream) {
  gemm::launch_grouped_gemm<WeightGradBf16DxSumsKernel>(p, num_ctas, stream, "weight_grads_with_dx_sums");
}

}  // namespace caracal::fused
