#include "validation_check.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <future>
#include <utility>

#include "caracal/bf16.hpp"
#include "caracal/error.hpp"
#include "caracal/reference.hpp"

namespace caracal::bench_tool {

namespace {

using checks::ErrorBound;
using checks::OutputError;

// A slice of bf16 bits widened.
std::vector<double> widen(const std::vector<uint16_t>& bits, size_t first, size_t count) {
  return from_bf16_bits(std::vector<uint16_t>(bits.begin() + static_cast<std::ptrdiff_t>(first),
                                              bits.begin() + static_cast<std::ptrdiff_t>(first + count)));
}

// The layer's sizes as host counts.
struct Sizes {
  explicit Sizes(const LayerConfig& c)
      : T(static_cast<size_t>(c.tokens_per_rank)), k(static_cast<size_t>(c.shape.top_k)),
        D(static_cast<size_t>(c.shape.hidden)), I(static_cast<size_t>(c.shape.intermediate)),
        L(static_cast<size_t>(c.local_experts())), Is(static_cast<size_t>(c.shape.shared_intermediate)),
        shared(c.shape.num_shared_experts > 0) {}
  size_t T, k, D, I, L, Is;
  bool shared;
};

// The reference layer of every routed expert (rank r holds experts [r*L, (r+1)*L)); no shared
// expert (each rank has its own: reference_of sets it).
ReferenceLayer routed_reference(const Sizes& s, const std::vector<RankStep>& ranks) {
  ReferenceLayer ref;
  for (const RankStep& r : ranks) {
    for (size_t l = 0; l < s.L; ++l) {
      caracal::ExpertWeights w;
      w.hidden = static_cast<int64_t>(s.D);
      w.intermediate = static_cast<int64_t>(s.I);
      w.gate = widen(r.w_gate, l * s.I * s.D, s.I * s.D);
      w.up = widen(r.w_up, l * s.I * s.D, s.I * s.D);
      w.down = widen(r.w_down, l * s.D * s.I, s.D * s.I);
      ref.experts.push_back(std::move(w));
    }
  }
  return ref;
}

struct RankReference {
  ReferenceInputs inputs;
  ReferenceForwardResult forward;
  ReferenceGradients grads;
};

RankReference reference_of(ReferenceLayer ref, const Sizes& s, const Routing& routing, const RankStep& r, int rank,
                           const ReferenceOptions& options) {
  if (s.shared) {
    ref.shared = caracal::ExpertWeights{static_cast<int64_t>(s.D), static_cast<int64_t>(s.Is),
                                        from_bf16_bits(r.shared_gate), from_bf16_bits(r.shared_up),
                                        from_bf16_bits(r.shared_down)};
  }
  RankReference out;
  out.inputs.tokens = static_cast<int64_t>(s.T);
  out.inputs.top_k = static_cast<int64_t>(s.k);
  out.inputs.x = from_bf16_bits(r.x);
  const int32_t* ids = routing.rank_topk(rank);
  out.inputs.topk_idx.assign(ids, ids + s.T * s.k);
  out.inputs.topk_scores.assign(r.scores.begin(), r.scores.end());
  out.forward = reference_forward(ref, out.inputs, options);
  out.grads = reference_backward(ref, out.inputs, out.forward, from_bf16_bits(r.dy));
  return out;
}

// One output's checks, rank by rank: each measure the worst rank's.
class OutputRecord {
 public:
  OutputRecord(std::string output, std::string row) {
    check_.output = std::move(output);
    check_.row = std::move(row);
  }
  void add(int rank, const OutputError& e, const ErrorBound& bound) {
    add(rank, {{"frobenius", e.frobenius(), bound.frobenius}, {"row", e.worst_row(), bound.row}}, e.failures(bound));
  }
  void add(int rank, const checks::ScoreGradientError& e) {
    add(rank, {{"slot", e.worst_over_allowed, 1.0}}, e.failures());
  }
  OutputCheck take() { return std::move(check_); }

 private:
  void add(int rank, const std::vector<Measure>& measures, const std::vector<std::string>& failures) {
    double over = 0.0;
    for (const Measure& m : measures) over = std::max(over, std::isnan(m.error) ? INFINITY : m.error / m.bound);
    if (check_.measures.empty()) check_.measures = measures;
    for (size_t i = 0; i < measures.size(); ++i) {
      Measure& kept = check_.measures[i];
      if (std::isnan(measures[i].error) || measures[i].error > kept.error) kept.error = measures[i].error;
    }
    if (rank == 0 || over > worst_over_) {
      worst_over_ = over;
      check_.worst_rank = rank;
    }
    checks::append(check_.failures, failures);
  }

  OutputCheck check_;
  double worst_over_ = 0.0;
};

// Throws caracal::Error naming the first array of `r` whose size is not what `s` makes it.
void check_sizes(const Sizes& s, const RankStep& r, int rank) {
  const size_t td = s.T * s.D, tk = s.T * s.k, expert = s.L * s.I * s.D, shared = s.shared ? s.Is * s.D : 0;
  const std::vector<std::pair<const char*, std::pair<size_t, size_t>>> sizes = {
      {"x", {r.x.size(), td}},
      {"dy", {r.dy.size(), td}},
      {"scores", {r.scores.size(), tk}},
      {"w_gate", {r.w_gate.size(), expert}},
      {"w_up", {r.w_up.size(), expert}},
      {"w_down", {r.w_down.size(), expert}},
      {"shared_gate", {r.shared_gate.size(), shared}},
      {"shared_up", {r.shared_up.size(), shared}},
      {"shared_down", {r.shared_down.size(), shared}},
      {"y", {r.y.size(), td}},
      {"dx", {r.dx.size(), td}},
      {"d_scores", {r.d_scores.size(), tk}},
      {"d_w_gate", {r.d_w_gate.size(), expert}},
      {"d_w_up", {r.d_w_up.size(), expert}},
      {"d_w_down", {r.d_w_down.size(), expert}},
      {"d_shared_gate", {r.d_shared_gate.size(), shared}},
      {"d_shared_up", {r.d_shared_up.size(), shared}},
      {"d_shared_down", {r.d_shared_down.size(), shared}}};
  for (const auto& [name, size] : sizes) {
    CARACAL_CHECK(size.first == size.second, "check_step: rank ", rank, "'s ", name, " holds ", size.first,
                  " values, expected ", size.second);
  }
}

std::string rank_name(int r, const char* output) { return "rank " + std::to_string(r) + " " + output; }

// One block of an fp32 output (a routed expert's, or the shared expert's, gradient) as one row.
void add_block(OutputError& e, const float* got, const std::vector<double>& want) {
  for (size_t i = 0; i < want.size(); ++i) e.add(got[i], want[i]);
  e.end_row();
}

}  // namespace

bool StepCheck::passed() const {
  return std::all_of(outputs.begin(), outputs.end(), [](const OutputCheck& o) { return o.passed(); });
}

std::string StepCheck::first_failure() const {
  for (const OutputCheck& o : outputs) {
    if (!o.passed()) return o.failures.front();
  }
  return "";
}

StepCheck check_step(const LayerConfig& config, const Routing& routing, const std::vector<RankStep>& ranks,
                     const checks::LayerRounding& rounding, bool bf16_weight_grads,
                     const checks::LayerBounds& bounds) {
  const Sizes s(config);
  const int W = static_cast<int>(config.ep_size);
  CARACAL_CHECK(ranks.size() == static_cast<size_t>(W), "check_step: ", ranks.size(), " ranks for W = ", W);
  for (int r = 0; r < W; ++r) check_sizes(s, ranks[size_t(r)], r);
  const ReferenceLayer routed = routed_reference(s, ranks);
  const std::vector<ReferenceOptions> options =
      checks::layer_reference_options(config.router, routing, config.shape.num_experts, rounding);
  std::vector<std::future<RankReference>> futures;
  for (int r = 0; r < W; ++r) {
    futures.push_back(std::async(std::launch::async, [&, r] {
      return reference_of(routed, s, routing, ranks[size_t(r)], r, options[size_t(r)]);
    }));
  }
  std::vector<RankReference> want;
  for (auto& f : futures) want.push_back(f.get());

  // The routed experts' weight gradients summed over the ranks whose tokens they served.
  std::vector<ExpertGradients> routed_grads(
      routed.experts.size(), ExpertGradients::zeros(static_cast<int64_t>(s.D), static_cast<int64_t>(s.I)));
  for (const RankReference& w : want) {
    for (size_t e = 0; e < routed_grads.size(); ++e) {
      const ExpertGradients& g = w.grads.d_experts[e];
      for (size_t i = 0; i < g.gate.size(); ++i) {
        routed_grads[e].gate[i] += g.gate[i];
        routed_grads[e].up[i] += g.up[i];
        routed_grads[e].down[i] += g.down[i];
      }
    }
  }

  const ErrorBound grad_bound = bf16_weight_grads ? checks::bf16_rounded(bounds.weight_grad) : bounds.weight_grad;
  OutputRecord y("y", "token"), dx("dx", "token"), scores("d_topk_scores", "slot");
  OutputRecord d_gate("d_w_gate", "expert"), d_up("d_w_up", "expert"), d_down("d_w_down", "expert");
  OutputRecord sd_gate("d_shared_w_gate", "whole"), sd_up("d_shared_w_up", "whole"), sd_down("d_shared_w_down", "whole");
  for (int r = 0; r < W; ++r) {
    const RankStep& got = ranks[size_t(r)];
    const RankReference& w = want[size_t(r)];
    const auto bf16_at = [](const std::vector<uint16_t>& v) {
      return [&v](size_t i) { return static_cast<double>(bf16_to_float(v[i])); };
    };
    OutputError ey(rank_name(r, "y")), edx(rank_name(r, "dx"));
    checks::add_rows(ey, bf16_at(got.y), w.forward.y, s.T, s.D);
    checks::add_rows(edx, bf16_at(got.dx), w.grads.dx, s.T, s.D);
    y.add(r, ey, bounds.y);
    dx.add(r, edx, bounds.dx);
    scores.add(r, checks::score_gradient_error(rank_name(r, "d_topk_scores"), got.d_scores, w.inputs, w.forward,
                                               w.grads, config.router, got.dy, bounds));
    OutputError eg(rank_name(r, "d_w_gate")), eu(rank_name(r, "d_w_up")), ed(rank_name(r, "d_w_down"));
    for (size_t l = 0; l < s.L; ++l) {
      const ExpertGradients& g = routed_grads[size_t(r) * s.L + l];
      add_block(eg, got.d_w_gate.data() + l * s.I * s.D, g.gate);
      add_block(eu, got.d_w_up.data() + l * s.I * s.D, g.up);
      add_block(ed, got.d_w_down.data() + l * s.D * s.I, g.down);
    }
    d_gate.add(r, eg, grad_bound);
    d_up.add(r, eu, grad_bound);
    d_down.add(r, ed, grad_bound);
    if (!s.shared) continue;
    OutputError sg(rank_name(r, "d_shared_w_gate")), su(rank_name(r, "d_shared_w_up")),
        sd(rank_name(r, "d_shared_w_down"));
    add_block(sg, got.d_shared_gate.data(), w.grads.d_shared->gate);
    add_block(su, got.d_shared_up.data(), w.grads.d_shared->up);
    add_block(sd, got.d_shared_down.data(), w.grads.d_shared->down);
    sd_gate.add(r, sg, grad_bound);
    sd_up.add(r, su, grad_bound);
    sd_down.add(r, sd, grad_bound);
  }
  StepCheck out;
  for (OutputRecord* o : {&y, &dx, &scores, &d_gate, &d_up, &d_down}) out.outputs.push_back(o->take());
  if (s.shared) {
    for (OutputRecord* o : {&sd_gate, &sd_up, &sd_down}) out.outputs.push_back(o->take());
  }
  return out;
}

}  // namespace caracal::bench_tool
