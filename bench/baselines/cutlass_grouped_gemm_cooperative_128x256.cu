// The CUTLASS grouped-GEMM baseline at Caracal's tile: the cooperative schedule (both consumer
// warpgroups on one tile) on 128 x 256 tiles without clusters — CUTLASS built the way Caracal's
// row-tile GEMMs are tiled, a stricter baseline than example 57's configurations.
#include "cutlass_grouped_gemm.cuh"

namespace caracal::bench {
namespace {

struct CooperativeOurTileSchedule {
  using KernelSchedule = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative;
  using EpilogueSchedule = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative;
  using TileShape = cute::Shape<cute::_128, cute::_256, cute::_64>;
  using ClusterShape = cute::Shape<cute::_1, cute::_1, cute::_1>;
};

}  // namespace

std::unique_ptr<CutlassGroupedGemm> make_cutlass_cooperative_our_tile(const CutlassGroupedProblem& problem) {
  return std::make_unique<cutlass_baseline::Runner<CooperativeOurTileSchedule>>(problem);
}

}  // namespace caracal::bench
