#pragma once
// The FP8 weight-gradient kernels: Fp8WeightGradGemm (fp32 gradients, weight_grad_fp8.cu) and
// Fp8WeightGradBf16Gemm (bf16, weight_grad_fp8_bf16.cu), one CTA a tile over the bf16 scheduler's
// walk in the FP8 policy's tiles. Both take the same parameters (weight_grad_fp8.cu builds them).
#include <cuda_runtime.h>

#include <type_traits>

#include "device/gemm/block_scaled_mainloop.cuh"
#include "device/gemm/expert_gemms/weight_grad_fp8.cuh"
#include "device/gemm/grouped_gemm_kernel.cuh"
#include "device/gemm/weight_tile_scheduler.cuh"

namespace caracal::gemm {

using Fp8WeightGradScheduler = WeightTileSchedulerFor<Fp8WeightGradGemm::Policy>;
using Fp8WeightGradKernel = Scheduled<Fp8WeightGradGemm, Fp8WeightGradScheduler>;
using Fp8WeightGradBf16Kernel = Scheduled<Fp8WeightGradBf16Gemm, Fp8WeightGradScheduler>;
using Fp8WeightGradParams = GemmParams<Fp8WeightGradKernel>;
static_assert(std::is_same_v<Fp8WeightGradGemm::Policy, Fp8WeightGradScheduler::Policy> &&
                  std::is_same_v<Fp8WeightGradBf16Gemm::Policy, Fp8WeightGradScheduler::Policy>,
              "the scheduler hands out tiles of the GEMMs' policy");
static_assert(std::is_same_v<Fp8WeightGradParams, GemmParams<Fp8WeightGradBf16Kernel>>, "one parameter builder");

void launch_fp8_weight_grad_bf16(Fp8WeightGradParams const& p, int num_ctas, cudaStream_t stream);

}  // namespace caracal::gemm
