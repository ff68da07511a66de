#pragma once
// fp64 CPU reference of the whole MoE layer (DESIGN §1), forward and backward: the oracle for the
// GPU kernels, one rank's tokens against all E experts (the math does not depend on placement):
//   y_t  = c_t * E_shared(x_t) + sum_{slots j of t, idx_j != -1} g_j * E_{idx_j}(x_t)
//   E(x) = W_down * ( SiLU(W_gate x) ⊙ W_up x )
//   g_j  = scale * s_j / sum_{valid l} s_l   (normalize)      or   scale * s_j   (otherwise)
// c_t: the optional per-token shared-output scale (all ones when not given). Every (token, slot)
// pair is its own route (an expert may appear in several slots of a token); empty slots (-1)
// contribute nothing and are left out of the normalization sum.
#include <cstdint>
#include <optional>
#include <vector>

#include "caracal/layer_config.hpp"

namespace caracal {

// One SwiGLU expert; row-major. Also the type of its gradient (same shapes).
struct ExpertWeights {
  int64_t hidden = 0;        // D
  int64_t intermediate = 0;  // I
  std::vector<double> gate;  // [I][D]
  std::vector<double> up;    // [I][D]
  std::vector<double> down;  // [D][I]

  static ExpertWeights zeros(int64_t hidden, int64_t intermediate);
};
using ExpertGradients = ExpertWeights;

struct ReferenceLayer {
  std::vector<ExpertWeights> experts;   // the E routed experts by global id; one D and one I
  std::optional<ExpertWeights> shared;  // the shared expert (same D, its own I), if any

  int64_t hidden() const { return experts.empty() ? 0 : experts.front().hidden; }
  int64_t num_experts() const { return static_cast<int64_t>(experts.size()); }
};

// One rank's tokens and their routing.
struct ReferenceInputs {
  int64_t tokens = 0;  // T
  int64_t top_k = 0;   // k
  std::vector<double> x;             // [T][D]
  std::vector<int32_t> topk_idx;     // [T][k], global expert ids in [0, E) or -1 (empty slot)
  std::vector<double> topk_scores;   // [T][k]
  std::vector<double> shared_scale;  // [T] per-token shared-output scale, or empty (= all ones);
                                     // needs a shared expert
};

// round_intermediates_to_bf16: the reference rounds (round_to_bf16: nearest even, through float)
// exactly what the kernels store as bf16, so GPU results can be checked tightly. Inputs (x,
// weights, dy) are assumed bf16-representable; scores, shared scales and g stay as given/computed.
// Forward, per route (routed or shared):
//   F1. gate = W_gate x and up = W_up x (GEMM outputs)            -> bf16
//   F2. act = SiLU(gate) * up (the activation), from the rounded gate and up -> bf16
//   F3. the expert output row E(x) = W_down act (unweighted)       -> bf16 (it travels as bf16)
//   F4. y_t = bf16(c_t * shared_row) + sum over ranks r of bf16(sum_{j on r} g_j * routed_row_j):
//       the routes of one rank's experts (experts_per_rank of them each) summed and rounded to
//       bf16 once, as combine pushes one row per (token, rank) (src/device/transfer/group_sum.cuh),
//       then added to the shared row and rounded once -> bf16. (The layer stores the scaled shared
//       row as bf16 before the combine; with c_t = 1 that is the row.) A fused layer whose ring
//       splits a token's routes on a rank over macrobatches rounds once per macrobatch instead
//       (ReferenceOptions::route_groups).
// Backward, per route with weight w (g_j, or c_t for the shared expert):
//   B1. d_activation = w * (W_down^T dy): not stored (kept in fp32 registers)  -> not rounded
//       dw = <W_down^T dy, act> (the router-score / shared-scale gradient) -> not rounded
//   B2. d_gate = d_activation * up * SiLU'(gate), d_up = d_activation * SiLU(gate), from the saved
//       (rounded) gate and up; they feed GEMMs                      -> bf16
//   B3. the route's dx row W_gate^T d_gate + W_up^T d_up           -> bf16 (it travels as bf16)
//   B4. dx_t = shared dx row + sum of routed dx rows in slot order, without intermediate
//       rounding                                                   -> bf16 once;
//       with ReferenceOptions::dx_route_groups, the routed rows of each group summed and rounded
//       to bf16 first (the fused backward's push per (token, rank), dx_group_sums.cuh).
//   B5. weight gradients (dW_gate = d_gate x^T, dW_up = d_up x^T, dW_down = dy bf16(w * act)^T,
//       from the rounded d_gate/d_up and the weighted act as the kernels store it) and
//       d_topk_scores / d_shared_scale -> not rounded.
// All sums are carried out in fp64. A kernel accumulating in fp32 therefore matches to within fp32
// rounding before each bf16 rounding point, i.e. up to one bf16 ulp where a value lands next to
// a bf16 rounding boundary (and that difference can propagate to later points).
struct ReferenceOptions {
  RouterNormalization router;
  bool round_intermediates_to_bf16 = false;  // the rounding points above
  int64_t experts_per_rank = 0;              // F4's groups (with rounding on); 0: one rank holds all
  // F4's groups given per route instead ([T][k]; routes of a token with equal values are summed
  // and rounded together): a fused layer's, whose ring cuts a rank's routes into macrobatches.
  std::vector<int64_t> route_groups;
  // B4's groups per route ([T][k]; routes of a token with equal values >= 0 are summed and rounded
  // to bf16 together, -1: alone), for a layer that groups its dx rows (MoELayer::groups_dx_rows);
  // empty: every route alone.
  std::vector<int64_t> dx_route_groups;
  // The routed and shared experts' GEMM operands as an FP8 layer quantizes them (caracal/
  // block_fp8.hpp, exact scales; needs round_intermediates_to_bf16, and D, I and the shared I
  // multiples of 128): the weights per 128 x 128 block of the interleaved W_gate_up [2I][D]
  // (caracal/gemm/gate_up_order.hpp) and of W_down [D][I] (the transposed copies hold the same
  // values); F1's x, F3's activation, B1's dy and B3's d_gate_up (interleaved) per 1 x 128 block of
  // their stored bf16 values. The weight gradients (B5) read the unquantized bf16 rows.
  bool fp8_experts = false;
};

// What one expert computed for a set of rows, as the kernels store it (rounded in bf16 mode).
struct ExpertActivations {
  int64_t rows = 0;
  int64_t intermediate = 0;
  int64_t hidden = 0;
  std::vector<double> gate;    // [rows][I] W_gate x
  std::vector<double> up;      // [rows][I] W_up x
  std::vector<double> swiglu;  // [rows][I] SiLU(gate) * up: the activation
  std::vector<double> output;  // [rows][D] E(x), unweighted
};

struct ReferenceForwardResult {
  ReferenceOptions options;   // backward runs with the same ones
  std::vector<double> y;      // [T][D]
  std::vector<double> gates;  // [T][k] g_j; 0 for empty slots
  ExpertActivations routed;   // rows = T*k, row = token*k + slot; all zero for empty slots
  ExpertActivations shared;   // rows = T; no rows when there is no shared expert
};

struct ReferenceGradients {
  std::vector<double> dx;                    // [T][D]
  std::vector<double> d_topk_scores;         // [T][k]; 0 for empty slots
  std::vector<double> d_shared_scale;        // [T] when a shared_scale was given, else empty
  std::vector<ExpertGradients> d_experts;    // [E]; all zero for experts without routes
  std::optional<ExpertGradients> d_shared;   // when the layer has a shared expert
};

// A token whose slots are all empty gets only the shared expert. With normalization on, a token
// whose valid scores sum to exactly 0 has no defined weights: its g are all 0 and its
// d_topk_scores too (its routed experts contribute nothing; dg is still computed), never a NaN.
// Throws caracal::Error naming the offending argument (and the size expected) for inconsistent
// sizes, an expert id outside [-1, E) (naming token and slot), or a shared_scale without a shared
// expert.
ReferenceForwardResult reference_forward(const ReferenceLayer& layer,
                                         const ReferenceInputs& inputs,
                                         const ReferenceOptions& options = {});

// Backward, for dy = dL/dy:
//   dg_j         = <dy_t, E_j(x_t)>, computed as <W_down^T dy_t, act_j> before g is applied
//                  (exact where g_j = 0: nothing divides by g);
//   d_topk_score = dg through the normalization Jacobian and the scale; 0 for empty slots;
//   d_shared_scale_t = <dy_t, E_shared(x_t)>, the same way;
//   dx, and the weight gradients of every routed expert (all zero for an expert without routes)
//   and of the shared expert. The shared expert is handled as a route with weight c_t.
// `forward` must come from reference_forward(layer, inputs, ...); dy is [T][D].
ReferenceGradients reference_backward(const ReferenceLayer& layer, const ReferenceInputs& inputs,
                                      const ReferenceForwardResult& forward,
                                      const std::vector<double>& dy);

}  // namespace caracal
