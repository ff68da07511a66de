#pragma once
// `caracal bench --rounds N`: the layer and every baseline timed in turn, round after round, so that
// the GPU's clock and power drift fall on all alike; what is reported is each figure's median over
// the rounds, and the ratios that compare two figures (ours over the GEMMs alone) round by round.
#include <vector>

#include "bench_report.hpp"

namespace caracal::bench_tool {

// Every time of `rounds` (one RunResult per round, the same configuration) replaced by its median
// over the rounds (the mean of the middle two for an even count); FLOPs, tokens, notes and
// availability from the first round. Throws caracal::Error for an empty vector.
RunResult median_of_rounds(const std::vector<RunResult>& rounds);

// Ours over the GEMMs alone in each round (the NCCL baseline's GEMMs), {forward, backward};
// empty where that baseline did not run.
struct RoundRatios {
  std::vector<double> forward, backward;
};
RoundRatios over_gemms_alone_by_round(const std::vector<RunResult>& rounds);

// The table's line of those ratios (nothing when there are none).
void print_round_ratios(const RoundRatios& ratios);

}  // namespace caracal::bench_tool
