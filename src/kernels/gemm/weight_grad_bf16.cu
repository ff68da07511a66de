// Backward step 3 with bf16 weight gradients: the weight-gradient GEMM of weight_grad.cu with the
// bf16 epilogue (the only grouped-GEMM instantiation in this unit). weight_grad.cu builds the
// parameters and calls this for the gradients asked for in bf16.
#include "kernels/gemm/launch.cuh"
#include "kernels/gemm/operand_loads.cuh"
#include "kernels/gemm/weight_grad_bf16.hpp"
#include "kernels/gemm/weight_grad_epilogue.cuh"
#include "kernels/gemm/weight_tile_scheduler.cuh"

namespace caracal::kernels::gemm {
namespace {

struct WeightGradBf16Gemm {
  using OperandA = MNMajorRows;
  using OperandB = MNMajorRows;
  using Scheduler = WeightTileScheduler;
  using Epilogue = WeightGradBf16Epilogue;
};

}  // namespace

void launch_weight_grad_bf16(Params const& p, int64_t tiles, int num_ctas, cudaStream_t stream) {
  launch_grouped_gemm<WeightGradBf16Gemm>(p, tiles, num_ctas, stream, "grouped_weight_grads");
}

}  // namespace caracal::kernels::gemm
