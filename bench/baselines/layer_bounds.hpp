#pragma once
// The bounds of one MoELayer step's outputs against the fp64 reference (caracal/reference.hpp,
// bf16-rounding mode), for the layer's GPU tests and `caracal bench`'s validation alike, and the
// per-element check of d_topk_scores. Host only; prints nothing.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "caracal/bf16.hpp"
#include "caracal/layer_config.hpp"
#include "caracal/reference.hpp"
#include "output_error.hpp"

namespace caracal::checks {

// Bounds of each output (output_error.hpp), about 3x the largest error measured on an H200 over
// every case of the layer suites (scripts/gpu-check.sh prints the errors each run measures). The reference rounds where the kernels store bf16, so what
// is left is fp32 accumulation order and the bf16 ties it tips: y = bf16(shared + sum g * row) of
// bf16 rows lands on a rounding tie often (all-to-one: one row with sum g = 1), where a 1e-7
// difference flips an ulp; that sets y's 1.3e-3 (worst row 4.4e-3). Measured maxima over three
// runs: y 1.3e-3 / 4.4e-3, dx 4.6e-4 / 3.7e-3, weight gradients 6.6e-4 / 9.6e-4 (worst expert),
// d_shared_scale 2.7e-4 (then, 2026-12-05 on an H100, 1.01e-3 on rank 0 of
// GpuMoELayerDeterminism with CARACAL_TEST_SEED=10012450979630841675, main and a branch alike: a
// per-token dot product <dy, shared row> whose terms cancel, as d_topk_scores' do), d_topk_scores
// 1.3e-4 B_t. d_topk_scores has a tail those runs missed:
// 1,000 repetitions of W8_zipf_noshared_k2_unnormalized failed 4e-4 B_t twice, at
// 5.2e-4 and 6.1e-4 B_t (0.5-0.75% of the value): dg = <d_h, act> recomputes act from the saved
// bf16 gate/up, and where the kernel's fp32 sum and the fp64 reference round a gate/up entry to
// neighbouring bf16 values (a 2^-8 step) the term moves by that much; a token whose |dg| nears B_t
// shows it whole.
struct LayerBounds {
  ErrorBound y{4e-3, 1.3e-2};          // per token row
  ErrorBound dx{1.5e-3, 1.2e-2};       // per token row
  ErrorBound weight_grad{2e-3, 3e-3};  // frobenius over all experts; row = one expert's (fp32 gradients)
  ErrorBound shared_scale_grad{3e-3, 3e-3};
  // d_topk_scores, per element: |got - want| <= score_rel * |want| + score_abs * B_t
  // (score_gradient_error).
  double score_rel = 1e-3;
  double score_abs = 1e-3;
};
inline constexpr LayerBounds kLayerBounds{};

// An FP8 layer (LayerConfig::precision kFP8) against the reference of the unquantized layer: what
// e4m3 operands cost, ~2^-4 relative a value, averaged over K. ~3x the errors measured on an H100
// (2026-12-06, test_gpu_moe_layer_fp8): y and dx 6.4% Frobenius, 9.4% the worst row; the weight
// gradients 5.5% and 5.6%; d_topk_scores 1.2e-2 B_t (a numpy emulation predicted the same).
inline constexpr LayerBounds kFp8LayerBounds{
    {1.9e-1, 2.8e-1}, {1.9e-1, 2.8e-1}, {1.6e-1, 1.7e-1}, {1.6e-1, 1.7e-1}, 1e-1, 4e-2};

// The bound of weight gradients stored in bf16 (MoEBackwardArgs::d_w_*_bf16: the fp32 sum g
// rounded once to nearest even) from that of the fp32 ones: with u = 2^-8, bf16's relative
// rounding error, |bf16(g) - g| <= u |g| element by element, so for any set of elements (the
// whole output, one expert's block) the triangle inequality gives
//   |bf16(g) - w| / |w| <= u + (1 + u) |g - w| / |w|.
inline ErrorBound bf16_rounded(const ErrorBound& fp32) {
  constexpr double u = 1.0 / 256.0;
  return {u + (1.0 + u) * fp32.frobenius, u + (1.0 + u) * fp32.row};
}

// What the per-element check of one rank's d_topk_scores measured.
struct ScoreGradientError {
  std::string name;
  size_t bad = 0;                   // slots out of bounds (or NaN)
  double frobenius = 0.0;           // relative, over the rank's slots (for the record: no bound)
  double worst_over_bt = 0.0;       // max |got - want| / B_t over filled slots
  double worst_over_allowed = 0.0;  // max |got - want| / (score_rel |want| + score_abs B_t); <= 1 passes
  std::string first_bad;            // "token t slot j: got ..., want ... (bound B_t)"

  std::vector<std::string> failures() const {
    if (bad == 0) return {};
    std::ostringstream m;
    m << name << " out of tolerance (or NaN) in " << bad << " slots, first: " << first_bad;
    return {m.str()};
  }
};

inline double norm(const double* v, size_t n) {
  double s = 0.0;
  for (size_t i = 0; i < n; ++i) s += v[i] * v[i];
  return std::sqrt(s);
}

// B_t of one token: (scale / S_t) |dy_t| max_j |E_j(x_t)| over its filled slots (`idx[j]` >= 0, S_t
// their scores' sum when the router normalizes), `outputs` its k expert output rows of `hidden`
// values (E_j(x_t), unweighted), `dy` its dy row.
inline double token_score_scale(const int32_t* idx, const double* scores, size_t k, const double* outputs,
                                const double* dy, size_t hidden, const RouterNormalization& router) {
  double sum = 0.0, largest = 0.0;
  for (size_t j = 0; j < k; ++j) {
    if (idx[j] < 0) continue;
    sum += scores[j];
    largest = std::max(largest, norm(outputs + j * hidden, hidden));
  }
  const double factor = router.normalize ? (sum != 0.0 ? router.scale / sum : 0.0) : router.scale;
  return factor * norm(dy, hidden) * largest;
}

// d_topk_scores = (scale / S) (dg_m - sum_j dg_j s_j / S) (or scale * dg_m) with dg_j = <dy, E_j(x)>
// a sum of products that may cancel, and so may the Jacobian's difference (to exactly 0 when all
// of a token's slots hold one expert): no relative measure fits. Per element
// |got - ref| <= score_rel |ref| + score_abs B_t, where B_t = (scale / S_t) max_j |dy_t| |E_j(x_t)|
// bounds the token's |dg| (Cauchy-Schwarz; typically 16x |dg| at D = 256); empty slots, and slots
// of a token whose B_t is 0, exactly equal to the reference. `dy` holds the rank's dy as bf16 bits.
inline ScoreGradientError score_gradient_error(const std::string& name, const std::vector<float>& got,
                                               const ReferenceInputs& inputs, const ReferenceForwardResult& forward,
                                               const ReferenceGradients& grads, const RouterNormalization& router,
                                               const std::vector<uint16_t>& dy, const LayerBounds& bounds) {
  ScoreGradientError out;
  out.name = name;
  const size_t k = static_cast<size_t>(inputs.top_k), T = static_cast<size_t>(inputs.tokens);
  const size_t D = T == 0 ? 0 : dy.size() / T;
  if (got.size() != grads.d_topk_scores.size() || got.size() != T * k) {
    out.bad = got.size();
    out.first_bad = "wrong size";
    out.frobenius = out.worst_over_bt = out.worst_over_allowed = INFINITY;
    return out;
  }
  double err2 = 0.0, ref2 = 0.0;
  std::ostringstream first;
  for (size_t t = 0; t < T; ++t) {
    std::vector<double> dy_t(D);
    for (size_t d = 0; d < D; ++d) dy_t[d] = bf16_to_float(dy[t * D + d]);
    const double bound = token_score_scale(&inputs.topk_idx[t * k], &inputs.topk_scores[t * k], k,
                                           forward.routed.output.data() + t * k * D, dy_t.data(), D, router);
    for (size_t j = 0; j < k; ++j) {
      const size_t i = t * k + j;
      const double want = grads.d_topk_scores[i];
      const bool empty = inputs.topk_idx[i] < 0;
      const double err = std::abs(static_cast<double>(got[i]) - want);
      err2 += err * err;
      ref2 += want * want;
      bool ok = false;
      if (empty || bound == 0.0) {
        ok = got[i] == static_cast<float>(want);
        if (!ok) out.worst_over_allowed = INFINITY;
      } else {
        const double allowed = bounds.score_rel * std::abs(want) + bounds.score_abs * bound;
        ok = err <= allowed;
        out.worst_over_bt = std::max(out.worst_over_bt, err / bound);
        out.worst_over_allowed = std::max(out.worst_over_allowed, err / allowed);
        if (std::isnan(err)) out.worst_over_bt = out.worst_over_allowed = INFINITY;
      }
      if (!ok && out.bad++ == 0) {
        first << "token " << t << " slot " << j << ": got " << got[i] << ", want " << want << " (bound " << bound
              << ")";
      }
    }
  }
  out.frobenius = ref2 > 0.0 ? std::sqrt(err2 / ref2) : (err2 == 0.0 ? 0.0 : INFINITY);
  out.first_bad = first.str();
  return out;
}

}  // namespace caracal::checks
