// Backward step 3 with bf16 weight gradients: the weight-gradient GEMM of weight_grad.cu with the
// bf16 epilogue (the only grouped-GEMM instantiation in this unit). weight_grad.cu builds the
// parameters and calls this for the gradients asked for in bf16.
#include "gemm/launch.cuh"
#include "gemm/weight_grad_gemms.cuh"
#include "gemm/weight_grad_launch.hpp"

namespace caracal::gemm {

void launch_weight_grad_bf16(WeightGradParams const& p, int num_ctas, cudaStream_t stream) {
  launch_grouped_gemm<WeightGradBf16Gemm>(p, num_ctas, stream, "grouped_weight_grads");
}

}  // namespace caracal::gemm
