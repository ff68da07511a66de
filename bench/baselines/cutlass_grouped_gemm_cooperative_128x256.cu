// The CUTLASS grouped-GEMM baseline at Caracal's tile: the cooperative schedule (both consumer
// warpgroups on one tile) on 128 x 256 tiles without clusters — CUTLASS built the way Caracal's
// row-tile GEMMs are tiled, a stricter baseline than example 57's configurations.
#include "cutlass_grouped_gemm.cuh"

namespace caracal::bench {

std::unique_ptr<CutlassGroupedGemm> make_cutlass_cooperative_our_tile(const CutlassGroupedProblem& problem) {
  return std::make_unique<cutlass_baseline::Runner<cutlass_baseline::CooperativeOurTileSchedule>>(problem);
}

}  // namespace caracal::bench
