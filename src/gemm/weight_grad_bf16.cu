// Backward step 3 with bf16 weight gradients: WeightGradBf16Gemm in CTA pairs (weight_grad_kernels.cuh;
// the only grouped-GEMM instantiation in this unit). weight_grad.cu builds the
// parameters and calls this for the gradients asked for in bf16.
#include "gemm/launch.cuh"
#include "gemm/weight_grad_kernels.cuh"
#include "gemm/weight_grad_launch.hpp"

namespace caracal::gemm {

void launch_weight_grad_bf16(WeightGradParams const& p, int num_ctas, cudaStream_t stream) {
  launch_grouped_gemm<WeightGradBf16Kernel>(p, num_ctas, stream, "grouped_weight_grads");
}

}  // namespace caracal::gemm
