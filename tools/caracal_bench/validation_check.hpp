#pragma once
// `caracal bench`'s validation, on the host: one step of a layer as it ran (every rank's inputs,
// weights and outputs) against the fp64 reference (caracal/reference.hpp, bf16-rounding mode,
// rounding as that layer does: bench/baselines/layer_reference_options.hpp), each output within the bounds
// the layer's GPU tests hold it to (bench/baselines/layer_bounds.hpp), per output and per row.
#include <cstdint>
#include <string>
#include <vector>

#include "caracal/layer_config.hpp"
#include "caracal/routing.hpp"
#include "layer_bounds.hpp"
#include "layer_reference_options.hpp"

namespace caracal::bench_tool {

// One rank's step as the layer read and wrote it; bf16 values as their bits, bf16 weight
// gradients widened to float (exactly). Weights and gradients of the rank's L routed experts with
// gate and up apart ([L][I][D], [L][I][D], [L][D][I]); the shared expert's, when there is one,
// likewise ([Is][D], [Is][D], [D][Is]).
struct RankStep {
  std::vector<uint16_t> x, dy;   // [T][D]
  std::vector<float> scores;     // [T][k]
  std::vector<uint16_t> w_gate, w_up, w_down;
  std::vector<uint16_t> shared_gate, shared_up, shared_down;
  std::vector<uint16_t> y, dx;   // [T][D]
  std::vector<float> d_scores;   // [T][k]
  std::vector<float> d_w_gate, d_w_up, d_w_down;
  std::vector<float> d_shared_gate, d_shared_up, d_shared_down;
};

// One measure of an output against its bound.
struct Measure {
  std::string name;  // "frobenius", "row" or, for d_topk_scores, "slot"
  double error = 0.0;
  double bound = 0.0;
};

// One output over every rank: each measure the worst rank's.
struct OutputCheck {
  std::string output;  // "y", "dx", "d_topk_scores", "d_w_gate", ..., "d_shared_w_down"
  std::string row;     // what the "row" measure's rows are
  std::vector<Measure> measures;
  int worst_rank = 0;                 // the rank of the largest error over its bound
  std::vector<std::string> failures;  // empty: within bounds on every rank
  bool passed() const { return failures.empty(); }
};

struct StepCheck {
  std::vector<OutputCheck> outputs;
  bool passed() const;
  std::string first_failure() const;  // empty when passed
};

// The step of `ranks` ([W]: every rank) on a layer of `config` with routing `routing` that rounds
// as `rounding` says, its weight gradients in bf16 or fp32, against the reference within `bounds`.
StepCheck check_step(const LayerConfig& config, const Routing& routing, const std::vector<RankStep>& ranks,
                     const checks::LayerRounding& rounding, bool bf16_weight_grads,
                     const checks::LayerBounds& bounds = checks::kLayerBounds);

}  // namespace caracal::bench_tool
