// The CUTLASS row-GEMM baseline (the dgrad's product, dx; bf16, W N-major), ping-pong schedule.
#include "cutlass_backward_gemms.cuh"

namespace caracal::bench {

std::unique_ptr<CutlassGroupedGemm> make_cutlass_row_gemm_pingpong(const CutlassRowGemmProblem& problem) {
  using Runner = cutlass_backward::Bf16Runner<cutlass_backward::Bf16Pingpong, cutlass::layout::RowMajor,
                                              cutlass::layout::RowMajor, cutlass::bfloat16_t>;
  return std::make_unique<Runner>(cutlass_backward::row_gemm_groups<cutlass::bfloat16_t>(problem));
}

}  // namespace caracal::bench
