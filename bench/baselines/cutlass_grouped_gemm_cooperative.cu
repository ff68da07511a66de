// The CUTLASS grouped-GEMM baseline, cooperative schedule: both consumer warpgroups on one
// 256 x 128 tile, clusters of 1 x 2 (example 57's configuration).
#include "cutlass_grouped_gemm.cuh"

namespace caracal::bench {

std::unique_ptr<CutlassGroupedGemm> make_cutlass_cooperative(const CutlassGroupedProblem& problem) {
  return std::make_unique<cutlass_baseline::Runner<cutlass_baseline::CooperativeSchedule>>(problem);
}

}  // namespace caracal::bench
