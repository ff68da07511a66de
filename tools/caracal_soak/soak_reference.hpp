#pragma once
// caracal-soak's check of one step against the fp64 reference (caracal/reference.hpp, bf16-rounding
// mode), at the soak's own shape, on a sample the host can afford every few steps:
//   * y, dx and d_topk_scores of kSampledTokensPerRank tokens of every rank (each path's ring and
//     dx groups, as the layer sums them: the GPU tests' reference_step);
//   * the weight gradients of one routed expert (all its routes, from every rank), rotating over
//     the experts the step routes to, and of one rank's shared expert (all its tokens);
// each as a relative Frobenius error ||got - ref|| / ||ref|| over the sample, against one bound per
// output (ReferenceBounds). Host only: the caller downloads what the plan names.
#include <cstdint>
#include <string>
#include <vector>

#include "caracal/layer_config.hpp"
#include "caracal/reference.hpp"
#include "caracal/routing.hpp"

namespace caracal::soak {

// The largest relative Frobenius error each output may show against the reference: about 3x the
// largest the GPU tests measured on an H200 for it (tests/gpu/moe_layer_test_support.hpp,
// LayerBounds; docs/results/*-gpu-check-errors-*.txt), which also bound each output as a whole, by
// row and per expert. d_topk_scores may cancel to 0 (all of a token's slots on one expert), so no
// relative measure fits it: its bound is per element, |got - want| <= d_topk_scores * B_t, with
// B_t = (scale / S_t) |dy_t| max_j |E_j(x_t)| bounding the token's |dg| (checks::score_gradient_error;
// ~5x the worst the GPU tests measured, 6.1e-4 B_t). bf16 weight gradients add one rounding of the
// fp32 sum: |bf16(v) - v| <= 2^-8 |v|.
struct ReferenceBounds {
  double y = 4e-3;
  double dx = 1.5e-3;
  double d_topk_scores = 3e-3;  // per element, in units of the token's B_t
  double weight_gradient = 3e-3;  // one expert's, fp32 (the tests' per-expert bound)
  double bf16_rounding = 1.0 / 256.0;
};
inline constexpr ReferenceBounds kReferenceBounds{};

inline constexpr int64_t kSampledTokensPerRank = 16;

// One rank's weights as the layer reads them, bf16 bits.
struct RankWeights {
  std::vector<uint16_t> w_gate_up;         // [L][2I][D], gate and up interleaved (gemm::gate_up_row)
  std::vector<uint16_t> w_down;            // [L][D][I]
  std::vector<uint16_t> shared_w_gate_up;  // [2Is][D], interleaved; empty without a shared expert
  std::vector<uint16_t> shared_w_down;     // [D][Is]
};

// What a check of step s looks at.
struct CheckPlan {
  std::vector<std::vector<int64_t>> tokens;  // [W] the sampled tokens of each rank
  int32_t expert = -1;                       // the routed expert whose weight gradients are checked; -1: none
  int shared_rank = -1;                      // whose shared expert's; -1: no shared expert
};
// Deterministic in (c, routing, step), so every rank's thread plans the same: min(T, 16) tokens of
// each rank spread over [0, T) and shifted by the step; the (step mod n)-th of the n experts with
// routes; rank step mod W.
CheckPlan plan_check(const LayerConfig& c, const Routing& routing, int64_t step);

// One path's outputs on one rank, downloaded; the weight gradients only where the plan names them.
struct PathOutputs {
  std::vector<uint16_t> y, dx;       // [T][D] bf16 bits
  std::vector<float> d_topk_scores;  // [T][k]
  // The checked expert's, on its home rank (else empty): [2I][D] interleaved and [D][I]; bf16
  // gradients as their values.
  std::vector<float> expert_gate_up, expert_down;
  // The checked shared expert's, on plan.shared_rank (else empty): [2Is][D] and [D][Is].
  std::vector<float> shared_gate_up, shared_down;
};

// One rank's inputs of the step and every path's outputs.
struct RankStep {
  std::vector<uint16_t> x, dy;     // [T][D] bf16 bits
  std::vector<float> topk_scores;  // [T][k]
  std::vector<PathOutputs> paths;  // [paths]
};

// How a path's layer sums what the reference must sum the same way.
struct PathLayout {
  std::string name;
  int64_t ring_rows = 0;        // MoELayer::ring_rows(): y's groups per macrobatch; 0 (v1): per rank
  bool groups_dx_rows = false;  // MoELayer::groups_dx_rows()
};

// One output of one path against the reference.
struct OutputCheck {
  std::string path, output;
  double error = 0.0;  // relative Frobenius; NaN where the output holds a NaN
  double bound = 0.0;
  std::string sample;  // what was compared, and the worst row for the per-token outputs
  bool passed() const { return error <= bound; }
};

class ReferenceModel {
 public:
  // Every rank's weights ([W]), widened to fp64 once.
  ReferenceModel(const LayerConfig& c, const std::vector<RankWeights>& ranks);

  // Every output of every path in `plan` against the reference of the step (`routing`, every rank's
  // inputs in `ranks`), computed on `threads` host threads. Throws caracal::Error when `ranks` does
  // not hold what the plan names.
  std::vector<OutputCheck> check(const Routing& routing, const CheckPlan& plan, const std::vector<PathLayout>& paths,
                                 const std::vector<RankStep>& ranks, bool bf16_gradients, int threads,
                                 const ReferenceBounds& bounds = kReferenceBounds) const;

 private:
  LayerConfig c_;
  std::vector<ExpertWeights> experts_;  // [E]
  std::vector<ExpertWeights> shared_;   // [W], or empty
};

}  // namespace caracal::soak
