// The CUTLASS grouped-GEMM baseline, cooperative schedule: both consumer warpgroups on one
// 256 x 128 tile, clusters of 1 x 2 (example 57's configuration).
#include "cutlass_grouped_gemm.cuh"

namespace caracal::bench {
namespace {

struct CooperativeSchedule {
  using KernelSchedule = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative;
  using EpilogueSchedule = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative;
  using TileShape = cute::Shape<cute::_256, cute::_128, cute::_64>;
  using ClusterShape = cute::Shape<cute::_1, cute::_2, cute::_1>;
};

}  // namespace

std::unique_ptr<CutlassGroupedGemm> make_cutlass_cooperative(const CutlassGroupedProblem& problem) {
  return std::make_unique<cutlass_baseline::Runner<CooperativeSchedule>>(problem);
}

}  // namespace caracal::bench
