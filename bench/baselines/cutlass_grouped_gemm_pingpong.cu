// The CUTLASS grouped-GEMM baseline, ping-pong schedule: each consumer warpgroup on its own
// 128 x 128 tile, one's epilogue under the other's mainloop, clusters of 2 x 1 (example 57's).
#include "cutlass_grouped_gemm.cuh"

namespace caracal::bench {
namespace {

struct PingpongSchedule {
  using KernelSchedule = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong;
  using EpilogueSchedule = cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong;
  using TileShape = cute::Shape<cute::_128, cute::_128, cute::_64>;
  using ClusterShape = cute::Shape<cute::_2, cute::_1, cute::_1>;
};

}  // namespace

std::unique_ptr<CutlassGroupedGemm> make_cutlass_pingpong(const CutlassGroupedProblem& problem) {
  return std::make_unique<cutlass_baseline::Runner<PingpongSchedule>>(problem);
}

}  // namespace caracal::bench
