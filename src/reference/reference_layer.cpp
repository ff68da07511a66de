#include "caracal/reference.hpp"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>

#include "caracal/bf16.hpp"
#include "caracal/block_fp8.hpp"
#include "caracal/error.hpp"
#include "caracal/gemm/gate_up_order.hpp"

namespace caracal {

ExpertWeights ExpertWeights::zeros(int64_t hidden, int64_t intermediate) {
  const auto n = static_cast<size_t>(hidden * intermediate);
  return ExpertWeights{hidden, intermediate, std::vector<double>(n), std::vector<double>(n),
                       std::vector<double>(n)};
}

namespace {

constexpr const char* kWhere = "reference: ";

// Rounds what the kernels store as bf16, or nothing in exact mode.
struct StorePrecision {
  bool bf16 = false;
  double operator()(double v) const { return bf16 ? round_to_bf16(v) : v; }
};

double sigmoid(double z) { return 1.0 / (1.0 + std::exp(-z)); }
double silu(double z) { return z * sigmoid(z); }
double silu_derivative(double z) {
  const double s = sigmoid(z);
  return s * (1.0 + z * (1.0 - s));
}

double dot(const double* a, const double* b, int64_t n) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// ---- Validation ------------------------------------------------------------------------------

void check_size(const std::string& name, size_t actual, int64_t expected,
                const std::string& shape) {
  CARACAL_CHECK(static_cast<int64_t>(actual) == expected, kWhere, name, " has ", actual,
                " values, expected ", expected, " (", shape, ")");
}

void validate_expert(const std::string& name, const ExpertWeights& w, int64_t hidden) {
  CARACAL_CHECK(w.hidden == hidden, kWhere, name, ".hidden is ", w.hidden, ", expected ", hidden,
                " (the layer's hidden size)");
  CARACAL_CHECK(w.intermediate >= 1, kWhere, name, ".intermediate must be at least 1, got ",
                w.intermediate);
  const std::string in_shape = "[I=" + std::to_string(w.intermediate) +
                               "][D=" + std::to_string(w.hidden) + "]";
  const std::string out_shape = "[D=" + std::to_string(w.hidden) +
                                "][I=" + std::to_string(w.intermediate) + "]";
  const int64_t n = w.hidden * w.intermediate;
  check_size(name + ".gate", w.gate.size(), n, in_shape);
  check_size(name + ".up", w.up.size(), n, in_shape);
  check_size(name + ".down", w.down.size(), n, out_shape);
}

void validate_layer(const ReferenceLayer& layer) {
  CARACAL_CHECK(!layer.experts.empty(), kWhere, "experts must hold at least one routed expert");
  const int64_t hidden = layer.hidden();
  CARACAL_CHECK(hidden >= 1, kWhere, "experts[0].hidden must be at least 1, got ", hidden);
  const int64_t intermediate = layer.experts.front().intermediate;
  for (size_t e = 0; e < layer.experts.size(); ++e) {
    const std::string name = "experts[" + std::to_string(e) + "]";
    validate_expert(name, layer.experts[e], hidden);
    CARACAL_CHECK(layer.experts[e].intermediate == intermediate, kWhere, name,
                  ".intermediate is ", layer.experts[e].intermediate, ", expected ", intermediate,
                  " (all routed experts share one intermediate size)");
  }
  if (layer.shared) validate_expert("shared", *layer.shared, hidden);
}

void validate_inputs(const ReferenceLayer& layer, const ReferenceInputs& in) {
  validate_layer(layer);
  CARACAL_CHECK(in.tokens >= 0, kWhere, "tokens must be non-negative, got ", in.tokens);
  CARACAL_CHECK(in.top_k >= 1, kWhere, "top_k must be at least 1, got ", in.top_k);
  const int64_t hidden = layer.hidden();
  const std::string td = "[tokens=" + std::to_string(in.tokens) + "][hidden=" +
                         std::to_string(hidden) + "]";
  const std::string tk = "[tokens=" + std::to_string(in.tokens) + "][top_k=" +
                         std::to_string(in.top_k) + "]";
  check_size("x", in.x.size(), in.tokens * hidden, td);
  check_size("topk_idx", in.topk_idx.size(), in.tokens * in.top_k, tk);
  check_size("topk_scores", in.topk_scores.size(), in.tokens * in.top_k, tk);
  if (!in.shared_scale.empty()) {
    CARACAL_CHECK(layer.shared.has_value(), kWhere,
                  "shared_scale is given but the layer has no shared expert");
    check_size("shared_scale", in.shared_scale.size(), in.tokens,
               "[tokens=" + std::to_string(in.tokens) + "], or empty");
  }
  const int64_t num_experts = layer.num_experts();
  for (int64_t t = 0; t < in.tokens; ++t) {
    for (int64_t j = 0; j < in.top_k; ++j) {
      const int32_t e = in.topk_idx[static_cast<size_t>(t * in.top_k + j)];
      CARACAL_CHECK(e >= -1 && e < num_experts, kWhere, "topk_idx[token ", t, "][slot ", j,
                    "] = ", e, " is outside [-1, ", num_experts, ")");
    }
  }
}

// The saved activations backward reads: gate, up and swiglu, [rows][intermediate].
void check_saved(const std::string& name, const ExpertActivations& saved, int64_t rows,
                 int64_t intermediate, const std::string& hint) {
  const std::string shape = "[" + std::to_string(rows) + "][" + std::to_string(intermediate) +
                            "]" + hint;
  check_size(name + ".gate", saved.gate.size(), rows * intermediate, shape);
  check_size(name + ".up", saved.up.size(), rows * intermediate, shape);
  check_size(name + ".swiglu", saved.swiglu.size(), rows * intermediate, shape);
}

void validate_forward(const ReferenceLayer& layer, const ReferenceInputs& in,
                      const ReferenceForwardResult& fwd) {
  const int64_t routes = in.tokens * in.top_k;
  const std::string hint = " (pass the result of reference_forward on the same layer and inputs)";
  check_size("forward.y", fwd.y.size(), in.tokens * layer.hidden(), "[T][D]" + hint);
  check_size("forward.gates", fwd.gates.size(), routes, "[T][k]" + hint);
  check_saved("forward.routed", fwd.routed, routes, layer.experts.front().intermediate, hint);
  check_saved("forward.shared", fwd.shared, layer.shared ? in.tokens : 0,
              layer.shared ? layer.shared->intermediate : 0, hint);
}

// ---- Router weights --------------------------------------------------------------------------

// Sum of the token's scores over its valid slots.
double valid_score_sum(const ReferenceInputs& in, int64_t token) {
  const auto row = static_cast<size_t>(token * in.top_k);
  double sum = 0.0;
  for (int64_t j = 0; j < in.top_k; ++j) {
    if (in.topk_idx[row + j] >= 0) sum += in.topk_scores[row + j];
  }
  return sum;
}

// scale / S, or 0 where the valid scores sum to exactly 0 (no defined weights: see the header).
double normalization_factor(double scale, double sum) { return sum != 0.0 ? scale / sum : 0.0; }

std::vector<double> router_gates(const ReferenceInputs& in, const RouterNormalization& router) {
  std::vector<double> gates(in.topk_scores.size(), 0.0);
  for (int64_t t = 0; t < in.tokens; ++t) {
    const auto row = static_cast<size_t>(t * in.top_k);
    const double factor = router.normalize ? normalization_factor(router.scale, valid_score_sum(in, t)) : router.scale;
    for (int64_t j = 0; j < in.top_k; ++j) {
      if (in.topk_idx[row + j] >= 0) gates[row + j] = factor * in.topk_scores[row + j];
    }
  }
  return gates;
}

// d_scores of one token from dL/dg of its slots (the normalization Jacobian and the scale).
void score_gradients(const ReferenceInputs& in, int64_t token, const RouterNormalization& router,
                     const double* d_gates, double* d_scores) {
  const auto row = static_cast<size_t>(token * in.top_k);
  const int32_t* idx = in.topk_idx.data() + row;
  const double* scores = in.topk_scores.data() + row;
  if (!router.normalize) {
    for (int64_t j = 0; j < in.top_k; ++j) {
      d_scores[j] = idx[j] >= 0 ? router.scale * d_gates[j] : 0.0;
    }
    return;
  }
  // g_j = c s_j / S  =>  dL/ds_m = (c / S) * (dg_m - sum_j dg_j s_j / S)
  const double sum = valid_score_sum(in, token);
  double weighted = 0.0;
  for (int64_t j = 0; j < in.top_k; ++j) {
    if (idx[j] >= 0) weighted += d_gates[j] * scores[j];
  }
  const double mean = sum != 0.0 ? weighted / sum : 0.0;
  for (int64_t j = 0; j < in.top_k; ++j) {
    d_scores[j] = idx[j] >= 0 ? normalization_factor(router.scale, sum) * (d_gates[j] - mean) : 0.0;
  }
}

// ---- FP8 operands (ReferenceOptions::fp8_experts) ------------------------------------------------

// `n` values of one row as an FP8 GEMM reads them: per 1 x 128 block of the stored values.
std::vector<double> fp8_row(const double* values, int64_t n) {
  return dequantize(quantize_rows(std::vector<float>(values, values + n), 1, n));
}

// A gate/up pair of rows of I each in the interleaved order ([2I], gate_up_row), and back.
std::vector<double> interleave(const double* gate, const double* up, int64_t I, int64_t cols) {
  std::vector<double> out(static_cast<size_t>(2 * I * cols));
  for (int64_t j = 0; j < I; ++j) {
    for (int64_t c = 0; c < cols; ++c) {
      out[static_cast<size_t>(gemm::gate_up_row(j, false) * cols + c)] = gate[j * cols + c];
      out[static_cast<size_t>(gemm::gate_up_row(j, true) * cols + c)] = up[j * cols + c];
    }
  }
  return out;
}
void deinterleave(const std::vector<double>& in, int64_t I, int64_t cols, double* gate, double* up) {
  for (int64_t j = 0; j < I; ++j) {
    for (int64_t c = 0; c < cols; ++c) {
      gate[j * cols + c] = in[static_cast<size_t>(gemm::gate_up_row(j, false) * cols + c)];
      up[j * cols + c] = in[static_cast<size_t>(gemm::gate_up_row(j, true) * cols + c)];
    }
  }
}

// An expert's weights as the FP8 GEMMs read them (per 128 x 128 block of W_gate_up interleaved and
// of W_down).
ExpertWeights fp8_weights(const ExpertWeights& w) {
  const int64_t D = w.hidden, I = w.intermediate;
  const auto blocks = [](const std::vector<double>& v, int64_t rows, int64_t cols) {
    return dequantize(quantize_blocks(std::vector<float>(v.begin(), v.end()), rows, cols));
  };
  ExpertWeights q = ExpertWeights::zeros(D, I);
  deinterleave(blocks(interleave(w.gate.data(), w.up.data(), I, D), 2 * I, D), I, D, q.gate.data(), q.up.data());
  q.down = blocks(w.down, D, I);
  return q;
}

// ---- One expert on one row -------------------------------------------------------------------

ExpertActivations make_activations(int64_t rows, int64_t intermediate, int64_t hidden) {
  const auto ri = static_cast<size_t>(rows * intermediate);
  return ExpertActivations{rows,
                           intermediate,
                           hidden,
                           std::vector<double>(ri),
                           std::vector<double>(ri),
                           std::vector<double>(ri),
                           std::vector<double>(static_cast<size_t>(rows * hidden))};
}

// Pointers to one row of an ExpertActivations.
struct ActivationRow {
  double* gate;
  double* up;
  double* swiglu;
  double* output;
};

ActivationRow row_of(ExpertActivations& a, int64_t row) {
  const auto ri = static_cast<size_t>(row * a.intermediate);
  return {a.gate.data() + ri, a.up.data() + ri, a.swiglu.data() + ri,
          a.output.data() + static_cast<size_t>(row * a.hidden)};
}

// Saved activations of one row, read-only.
struct SavedRow {
  const double* gate;
  const double* up;
  const double* swiglu;
};

SavedRow saved_row_of(const ExpertActivations& a, int64_t row) {
  const auto ri = static_cast<size_t>(row * a.intermediate);
  return {a.gate.data() + ri, a.up.data() + ri, a.swiglu.data() + ri};
}

// `w`: the weights the GEMMs read (fp8_weights' with `fp8`, whose x and activation are then
// quantized per 1 x 128 block).
void expert_forward(const ExpertWeights& w, const double* x_in, StorePrecision store, ActivationRow out, bool fp8) {
  const int64_t D = w.hidden;
  const int64_t I = w.intermediate;
  const std::vector<double> x_fp8 = fp8 ? fp8_row(x_in, D) : std::vector<double>();
  const double* x = fp8 ? x_fp8.data() : x_in;
  for (int64_t i = 0; i < I; ++i) {
    const auto r = static_cast<size_t>(i * D);
    out.gate[i] = store(dot(w.gate.data() + r, x, D));                 // F1
    out.up[i] = store(dot(w.up.data() + r, x, D));                     // F1
    out.swiglu[i] = store(silu(out.gate[i]) * out.up[i]);              // F2
  }
  const std::vector<double> act_fp8 = fp8 ? fp8_row(out.swiglu, I) : std::vector<double>();
  const double* act = fp8 ? act_fp8.data() : out.swiglu;
  for (int64_t d = 0; d < D; ++d) {
    out.output[d] = store(dot(w.down.data() + static_cast<size_t>(d * I), act, I));  // F3
  }
}

// Backward of one route with weight `weight` (g_j, or the shared scale). Accumulates the weight
// gradients into `grad`, writes the route's dx row and returns dL/dweight = <dy, E(x)>. `w`: the
// weights the GEMMs read (fp8_weights' with `fp8`, whose B1 dy and B3 d_gate_up are then
// quantized per 1 x 128 block; B5 reads the bf16 rows).
double expert_backward(const ExpertWeights& w, const double* x, const double* dy_in, double weight, SavedRow saved,
                       StorePrecision store, ExpertGradients& grad, double* dx_row, bool fp8) {
  const int64_t D = w.hidden;
  const int64_t I = w.intermediate;
  const std::vector<double> dy_fp8 = fp8 ? fp8_row(dy_in, D) : std::vector<double>();
  const double* dy = fp8 ? dy_fp8.data() : dy_in;
  // W_down^T dy, before the weight is applied: this is what keeps dL/dweight exact at weight 0.
  std::vector<double> down_t_dy(static_cast<size_t>(I), 0.0);
  std::vector<double> weighted_swiglu(static_cast<size_t>(I));
  for (int64_t i = 0; i < I; ++i) weighted_swiglu[i] = store(weight * saved.swiglu[i]);  // B5
  for (int64_t d = 0; d < D; ++d) {
    const double* down_row = w.down.data() + static_cast<size_t>(d * I);
    double* grad_row = grad.down.data() + static_cast<size_t>(d * I);
    for (int64_t i = 0; i < I; ++i) {
      down_t_dy[i] += down_row[i] * dy[d];
      grad_row[i] += dy_in[d] * weighted_swiglu[i];  // B5
    }
  }
  const double d_weight = dot(down_t_dy.data(), saved.swiglu, I);  // B1

  std::vector<double> d_gate(static_cast<size_t>(I)), d_up(static_cast<size_t>(I));
  for (int64_t i = 0; i < I; ++i) {
    const double d_swiglu = weight * down_t_dy[i];  // B1: not rounded
    d_gate[i] = store(d_swiglu * saved.up[i] * silu_derivative(saved.gate[i]));  // B2
    d_up[i] = store(d_swiglu * silu(saved.gate[i]));                             // B2
  }
  std::vector<double> dx_gate = d_gate, dx_up = d_up;  // what B3 reads
  if (fp8) deinterleave(fp8_row(interleave(d_gate.data(), d_up.data(), I, 1).data(), 2 * I), I, 1, dx_gate.data(), dx_up.data());
  for (int64_t d = 0; d < D; ++d) dx_row[d] = 0.0;
  for (int64_t i = 0; i < I; ++i) {
    const auto r = static_cast<size_t>(i * D);
    const double* gate_row = w.gate.data() + r;
    const double* up_row = w.up.data() + r;
    double* grad_gate_row = grad.gate.data() + r;
    double* grad_up_row = grad.up.data() + r;
    for (int64_t d = 0; d < D; ++d) {
      grad_gate_row[d] += d_gate[i] * x[d];  // B5
      grad_up_row[d] += d_up[i] * x[d];      // B5
      dx_row[d] += dx_gate[i] * gate_row[d] + dx_up[i] * up_row[d];
    }
  }
  for (int64_t d = 0; d < D; ++d) dx_row[d] = store(dx_row[d]);  // B3
  return d_weight;
}

// The routed and the shared experts' weights as the GEMMs read them: fp8_weights' with
// options.fp8_experts (else empty).
struct GemmWeights {
  std::vector<ExpertWeights> routed;
  std::optional<ExpertWeights> shared;
};
GemmWeights fp8_gemm_weights(const ReferenceLayer& layer, const ReferenceOptions& options) {
  if (!options.fp8_experts) return {};
  CARACAL_CHECK(options.round_intermediates_to_bf16, kWhere,
                "options.fp8_experts needs options.round_intermediates_to_bf16 (the FP8 operands quantize stored bf16 values)");
  const int64_t D = layer.hidden(), I = layer.experts.front().intermediate;
  const int64_t Is = layer.shared ? layer.shared->intermediate : 0;
  CARACAL_CHECK(D % kFp8Block == 0 && I % kFp8Block == 0 && Is % kFp8Block == 0, kWhere,
                "options.fp8_experts needs D, I and the shared I multiples of ", kFp8Block, ", got D = ", D,
                ", I = ", I, ", shared I = ", Is);
  GemmWeights q;
  q.routed.reserve(layer.experts.size());
  for (const ExpertWeights& w : layer.experts) q.routed.push_back(fp8_weights(w));
  if (layer.shared) q.shared = fp8_weights(*layer.shared);
  return q;
}

double shared_scale_of(const ReferenceInputs& in, int64_t token) {
  return in.shared_scale.empty() ? 1.0 : in.shared_scale[static_cast<size_t>(token)];
}

}  // namespace

ReferenceForwardResult reference_forward(const ReferenceLayer& layer,
                                         const ReferenceInputs& inputs,
                                         const ReferenceOptions& options) {
  validate_inputs(layer, inputs);
  CARACAL_CHECK(std::isfinite(options.router.scale), kWhere,
                "options.router.scale must be finite, got ", options.router.scale);
  const int64_t D = layer.hidden();
  const int64_t T = inputs.tokens;
  const int64_t k = inputs.top_k;
  const StorePrecision store{options.round_intermediates_to_bf16};

  ReferenceForwardResult result;
  result.options = options;
  result.y.assign(static_cast<size_t>(T * D), 0.0);
  result.gates = router_gates(inputs, options.router);
  result.routed = make_activations(T * k, layer.experts.front().intermediate, D);
  result.shared = make_activations(layer.shared ? T : 0,
                                   layer.shared ? layer.shared->intermediate : 0, D);

  CARACAL_CHECK(options.experts_per_rank >= 0, "reference_forward: options.experts_per_rank must be >= 0, got ",
                options.experts_per_rank);
  const int64_t E = static_cast<int64_t>(layer.experts.size());
  const int64_t per_rank = options.experts_per_rank > 0 ? options.experts_per_rank : E;
  CARACAL_CHECK(options.route_groups.empty() || static_cast<int64_t>(options.route_groups.size()) == T * k,
                "reference_forward: options.route_groups must be empty or hold T * k = ", T * k, " entries, got ",
                options.route_groups.size());
  const GemmWeights fp8 = fp8_gemm_weights(layer, options);
  const bool quantized = options.fp8_experts;
  std::vector<double> sum(static_cast<size_t>(D));
  // F4's sums of one token: its groups' ids and sums, in order of appearance.
  std::vector<int64_t> group_ids;
  std::vector<std::vector<double>> group_sums;
  for (int64_t t = 0; t < T; ++t) {
    const double* x = inputs.x.data() + static_cast<size_t>(t * D);
    std::fill(sum.begin(), sum.end(), 0.0);
    if (layer.shared) {
      const ActivationRow row = row_of(result.shared, t);
      expert_forward(quantized ? *fp8.shared : *layer.shared, x, store, row, quantized);
      const double scale = shared_scale_of(inputs, t);
      for (int64_t d = 0; d < D; ++d) sum[d] += store(scale * row.output[d]);  // F4: the scaled row as stored
    }
    group_ids.clear();
    group_sums.clear();
    for (int64_t j = 0; j < k; ++j) {
      const int64_t route = t * k + j;
      const int32_t expert = inputs.topk_idx[static_cast<size_t>(route)];
      if (expert < 0) continue;
      const ActivationRow row = row_of(result.routed, route);
      const auto e = static_cast<size_t>(expert);
      expert_forward(quantized ? fp8.routed[e] : layer.experts[e], x, store, row, quantized);
      const double g = result.gates[static_cast<size_t>(route)];
      const int64_t id = options.route_groups.empty() ? expert / per_rank
                                                      : options.route_groups[static_cast<size_t>(route)];
      size_t group = 0;
      while (group < group_ids.size() && group_ids[group] != id) ++group;
      if (group == group_ids.size()) {
        group_ids.push_back(id);
        group_sums.emplace_back(static_cast<size_t>(D), 0.0);
      }
      for (int64_t d = 0; d < D; ++d) group_sums[group][static_cast<size_t>(d)] += g * row.output[d];
    }
    for (const std::vector<double>& group : group_sums) {
      for (int64_t d = 0; d < D; ++d) sum[d] += store(group[static_cast<size_t>(d)]);  // F4: one row per group
    }
    double* y = result.y.data() + static_cast<size_t>(t * D);
    for (int64_t d = 0; d < D; ++d) y[d] = store(sum[d]);  // F4
  }
  return result;
}

ReferenceGradients reference_backward(const ReferenceLayer& layer, const ReferenceInputs& inputs,
                                      const ReferenceForwardResult& forward,
                                      const std::vector<double>& dy) {
  validate_inputs(layer, inputs);
  validate_forward(layer, inputs, forward);
  const int64_t D = layer.hidden();
  const int64_t T = inputs.tokens;
  const int64_t k = inputs.top_k;
  check_size("dy", dy.size(), T * D,
             "[tokens=" + std::to_string(T) + "][hidden=" + std::to_string(D) + "]");
  const StorePrecision store{forward.options.round_intermediates_to_bf16};

  ReferenceGradients grads;
  grads.dx.assign(static_cast<size_t>(T * D), 0.0);
  grads.d_topk_scores.assign(static_cast<size_t>(T * k), 0.0);
  if (!inputs.shared_scale.empty()) grads.d_shared_scale.assign(static_cast<size_t>(T), 0.0);
  grads.d_experts.reserve(layer.experts.size());
  for (const ExpertWeights& w : layer.experts) {
    grads.d_experts.push_back(ExpertWeights::zeros(w.hidden, w.intermediate));
  }
  if (layer.shared) {
    grads.d_shared = ExpertWeights::zeros(layer.shared->hidden, layer.shared->intermediate);
  }

  const std::vector<int64_t>& groups = forward.options.dx_route_groups;
  CARACAL_CHECK(groups.empty() || static_cast<int64_t>(groups.size()) == T * k,
                "reference_backward: options.dx_route_groups must be empty or hold T * k = ", T * k, " entries, got ",
                groups.size());
  const GemmWeights fp8 = fp8_gemm_weights(layer, forward.options);
  const bool quantized = forward.options.fp8_experts;
  std::vector<double> dx_sum(static_cast<size_t>(D));
  std::vector<double> dx_row(static_cast<size_t>(D));
  std::vector<double> d_gates(static_cast<size_t>(k));
  // B4's groups of one token: their ids and sums, in order of appearance.
  std::vector<int64_t> group_ids;
  std::vector<std::vector<double>> group_sums;
  for (int64_t t = 0; t < T; ++t) {
    const double* x = inputs.x.data() + static_cast<size_t>(t * D);
    const double* dy_t = dy.data() + static_cast<size_t>(t * D);
    std::fill(dx_sum.begin(), dx_sum.end(), 0.0);
    if (layer.shared) {
      const double d_scale =
          expert_backward(quantized ? *fp8.shared : *layer.shared, x, dy_t, shared_scale_of(inputs, t),
                          saved_row_of(forward.shared, t), store, *grads.d_shared, dx_row.data(), quantized);
      if (!grads.d_shared_scale.empty()) grads.d_shared_scale[static_cast<size_t>(t)] = d_scale;
      for (int64_t d = 0; d < D; ++d) dx_sum[d] += dx_row[d];
    }
    group_ids.clear();
    group_sums.clear();
    for (int64_t j = 0; j < k; ++j) {
      const int64_t route = t * k + j;
      const int32_t expert = inputs.topk_idx[static_cast<size_t>(route)];
      d_gates[j] = 0.0;
      if (expert < 0) continue;
      const auto e = static_cast<size_t>(expert);
      d_gates[j] = expert_backward(quantized ? fp8.routed[e] : layer.experts[e], x, dy_t,
                                   forward.gates[static_cast<size_t>(route)],
                                   saved_row_of(forward.routed, route), store, grads.d_experts[e],
                                   dx_row.data(), quantized);
      const int64_t id = groups.empty() ? -1 : groups[static_cast<size_t>(route)];
      if (id < 0) {
        for (int64_t d = 0; d < D; ++d) dx_sum[d] += dx_row[d];
        continue;
      }
      size_t group = 0;
      while (group < group_ids.size() && group_ids[group] != id) ++group;
      if (group == group_ids.size()) {
        group_ids.push_back(id);
        group_sums.emplace_back(static_cast<size_t>(D), 0.0);
      }
      for (int64_t d = 0; d < D; ++d) group_sums[group][static_cast<size_t>(d)] += dx_row[d];
    }
    for (const std::vector<double>& group : group_sums) {
      for (int64_t d = 0; d < D; ++d) dx_sum[d] += store(group[static_cast<size_t>(d)]);  // B4: one row per group
    }
    score_gradients(inputs, t, forward.options.router, d_gates.data(),
                    grads.d_topk_scores.data() + static_cast<size_t>(t * k));
    double* dx = grads.dx.data() + static_cast<size_t>(t * D);
    for (int64_t d = 0; d < D; ++d) dx[d] = store(dx_sum[d]);  // B4
  }
  return grads;
}

}  // namespace caracal
