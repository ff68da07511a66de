// The CUTLASS grouped-GEMM baseline, ping-pong schedule: each consumer warpgroup on its own
// 128 x 128 tile, one's epilogue under the other's mainloop, clusters of 2 x 1 (example 57's).
#include "cutlass_grouped_gemm.cuh"

namespace caracal::bench {

std::unique_ptr<CutlassGroupedGemm> make_cutlass_pingpong(const CutlassGroupedProblem& problem) {
  return std::make_unique<cutlass_baseline::Runner<cutlass_baseline::PingpongSchedule>>(problem);
}

}  // namespace caracal::bench
