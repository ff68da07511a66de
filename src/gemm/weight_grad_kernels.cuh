#pragma once
// The weight-gradient kernels: the GEMMs of device/gemm/expert_gemms/weight_grad.cuh (fp32) and
// weight_grad_bf16.cuh as weight_grad.cu and weight_grad_bf16.cu schedule them; a fused unit runs
// the same tiles with IdleWarps work of its own (src/fused/weight_grad_dx_sums.cuh).
#include <type_traits>

#include "device/gemm/expert_gemms/weight_grad.cuh"
#include "device/gemm/expert_gemms/weight_grad_bf16.cuh"
#include "device/gemm/grouped_gemm_kernel.cuh"
#include "device/gemm/paired_gemm_kernel.cuh"
#include "device/gemm/weight_tile_pair_scheduler.cuh"
#include "device/gemm/weight_tile_scheduler.cuh"

namespace caracal::gemm {

// fp32 gradients, one CTA a tile (CTA pairs measured 1-3% slower here on balanced routings).
using WeightGradKernel = Scheduled<WeightGradGemm, WeightTileScheduler>;
static_assert(std::is_same_v<WeightGradGemm::Policy, WeightTileScheduler::Policy>,
              "the scheduler hands out tiles of the GEMM's policy");

// bf16 gradients in CTA pairs sharing the N operand (paired_gemm_kernel.cuh): 2-15% faster than
// one CTA a tile here.
using WeightGradBf16Kernel = ScheduledInPairs<WeightGradBf16Gemm, WeightTilePairScheduler>;
static_assert(std::is_same_v<WeightGradBf16Gemm::Policy, WeightTilePairScheduler::Policy>,
              "the scheduler hands out tiles of the GEMM's policy");

}  // namespace caracal::gemm
