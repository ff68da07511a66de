// Backward step 3 in FP8 with bf16 weight gradients: Fp8WeightGradBf16Gemm (the only grouped-GEMM
// instantiation in this unit). weight_grad_fp8.cu builds the parameters and calls this for the
// gradients asked for in bf16.
#include "gemm/launch.cuh"
#include "gemm/weight_grad_fp8_kernels.cuh"

namespace caracal::gemm {

void launch_fp8_weight_grad_bf16(Fp8WeightGradParams const& p, int num_ctas, cudaStream_t stream) {
  launch_grouped_gemm<Fp8WeightGradBf16Kernel>(p, num_ctas, stream, "grouped_weight_grads (fp8)");
}

}  // namespace caracal::gemm
