#pragma once
// The weight-gradient kernels (gemm/weight_grad_kernels.cuh) with the reverse dispatch of a world of
// one rank on their idle producer warps (src/fused/weight_grads_dx_sums.hpp): the tiles as they are,
// and warps 1-3 of every CTA summing every token's dx and d topk_scores as
// reverse_dispatch_single_rank.cu's launch does (single_rank_dx_sums.cuh), which no tile waits on.
#include <cuda_runtime.h>

#include "device/comm/device_world.cuh"
#include "device/transfer/single_rank_dx_sums.cuh"
#include "gemm/weight_grad_kernels.cuh"
#include "transfer/exchange_launch.hpp"

namespace caracal::fused {

struct SingleRankDxSums {
  struct Params {
    comm::DeviceWorld world;
    transfer::detail::ExchangeArgs args;  // ExchangeInternals::filled_dx_slots_args
  };
  // Slot rows a lane loads at a time: the most within the producer warpgroup's 56 registers
  // (ptxas spills at 6).
  static constexpr int kSlotsInFlight = 4;
  __device__ __forceinline__ static void run(Params const& p, int worker, int workers, int lane) {
    transfer::detail::single_rank_token_dx</*kFromExpertRows=*/false, kSlotsInFlight>(p.world, p.args,
                                                                                       {worker, workers}, lane);
  }
};

// fp32 gradients: the producer warpgroup given the CTA pairs' budget (56 registers; 40 by default).
struct WeightGradDxSumsKernel : gemm::WeightGradKernel {
  using IdleWarps = SingleRankDxSums;
  static constexpr gemm::RegisterSplit kRegisterSplit = gemm::kPairRegisterSplit;
};

// bf16 gradients in CTA pairs (already at 56).
struct WeightGradBf16DxSumsKernel : gemm::WeightGradBf16Kernel {
  using IdleWarps = SingleRankDxSums;
};

using WeightGradDxSumsParams = gemm::GemmParams<WeightGradDxSumsKernel>;
static_assert(std::is_same_v<WeightGradDxSumsParams, gemm::GemmParams<WeightGradBf16DxSumsKernel>>);

// One instantiation per unit: weight_grad_dx_sums.cu (fp32), weight_grad_bf16_dx_sums.cu (bf16).
void launch_weight_grad_dx_sums(const WeightGradDxSumsParams& p, int num_ctas, cudaStream_t stream);
void launch_weight_grad_bf16_dx_sums(const WeightGradDxSumsParams& p, int num_ctas, cudaStream_t stream);

}  // namespace caracal::fused
