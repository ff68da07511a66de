// Backward step 3 with bf16 weight gradients: the weight-gradient GEMM of weight_grad.cu with the
// bf16 epilogue (the only grouped-GEMM instantiation in this unit). weight_grad.cu builds the
// parameters and calls this for the gradients asked for in bf16.
#include "device/gemm/operand_loads.cuh"
#include "device/gemm/weight_grad_epilogue.cuh"
#include "device/gemm/weight_tile_pair_scheduler.cuh"
#include "gemm/launch.cuh"
#include "gemm/weight_grad_bf16.hpp"

namespace caracal::gemm {
namespace {

struct WeightGradBf16Gemm {
  using OperandA = MNMajorRows;
  using OperandB = MNMajorRows;
  // CTA pairs sharing the N operand (paired_gemm_kernel.cuh): 2-15% faster than one CTA a tile
  // here, while the fp32 kernel (weight_grad.cu) measured 1-3% slower in pairs on balanced routings.
  using Scheduler = WeightTilePairScheduler;
  static constexpr RegisterSplit kRegisterSplit = kPairRegisterSplit;
  using Epilogue = WeightGradBf16Epilogue;
};

}  // namespace

void launch_weight_grad_bf16(WeightGradParams const& p, int num_ctas, cudaStream_t stream) {
  launch_grouped_gemm<WeightGradBf16Gemm>(p, num_ctas, stream, "grouped_weight_grads");
}

}  // namespace caracal::gemm
