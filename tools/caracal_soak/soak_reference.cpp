#include "soak_reference.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

#include "caracal/bf16.hpp"
#include "caracal/error.hpp"
#include "caracal/moe_layer.hpp"
#include "caracal/schedule.hpp"
#include "layer_bounds.hpp"  // bench/baselines

namespace caracal::soak {
namespace {

// Tokens per task of the weight-gradient sums (the tasks' partial sums are added in fp64).
constexpr size_t kTokensPerChunk = 16;

std::vector<double> widen(const uint16_t* bits, size_t count) {
  std::vector<double> out(count);
  for (size_t i = 0; i < count; ++i) out[i] = static_cast<double>(bf16_to_float(bits[i]));
  return out;
}

// Expert `local` of a rank's weights (the shared expert's with `shared`), split gate and up, in fp64.
ExpertWeights widen_expert(const RankWeights& w, bool shared, size_t local, int64_t D, int64_t I) {
  const size_t n = static_cast<size_t>(I * D);
  const std::vector<uint16_t>& gate_up = shared ? w.shared_w_gate_up : w.w_gate_up;
  const std::vector<uint16_t>& down = shared ? w.shared_w_down : w.w_down;
  CARACAL_CHECK(gate_up.size() >= (local + 1) * 2 * n && down.size() >= (local + 1) * n,
                "caracal-soak: a rank's weights hold fewer experts than the layer's");
  std::vector<uint16_t> gate(n), up(n);
  deinterleave_gate_up_host(gate_up.data() + local * 2 * n, gate.data(), up.data(), 1, I, D);
  return ExpertWeights{D, I, widen(gate.data(), n), widen(up.data(), n), widen(down.data() + local * n, n)};
}

// Runs body(0 .. n-1) on `threads` threads; rethrows the first exception.
void parallel_for(size_t n, int threads, const std::function<void(size_t)>& body) {
  std::atomic<size_t> next{0};
  std::exception_ptr error;
  std::mutex mutex;
  const auto work = [&] {
    for (size_t i = next++; i < n; i = next++) {
      try {
        body(i);
      } catch (...) {
        const std::lock_guard<std::mutex> lock(mutex);
        if (!error) error = std::current_exception();
      }
    }
  };
  std::vector<std::thread> pool;
  const size_t extra = std::min(n, static_cast<size_t>(std::max(threads, 1))) - (n > 0 ? 1 : 0);
  for (size_t t = 0; t < extra; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

// ||got - want|| / ||want|| (0 when both are 0, infinite when only want is); NaN with a NaN.
struct Frobenius {
  double err2 = 0.0, ref2 = 0.0;
  void add(double got, double want) {
    err2 += (got - want) * (got - want);
    ref2 += want * want;
  }
  double relative() const {
    if (std::isnan(err2)) return err2;
    return ref2 == 0.0 ? (err2 == 0.0 ? 0.0 : INFINITY) : std::sqrt(err2 / ref2);
  }
};

// y's route groups (ReferenceOptions::route_groups) of rank r as layout `p`'s layer sums them, and
// dx's (dx_route_groups; empty where the layer sends a dx row per route): the GPU tests'
// reference_step (tests/gpu/moe_layer_test_support.hpp).
struct RouteGroups {
  std::vector<int64_t> y, dx;  // [T*k]
};

RouteGroups route_groups(const LayerConfig& c, const Routing& routing, const Schedule* schedule, const PathLayout& p,
                         int r) {
  const size_t routes = static_cast<size_t>(c.tokens_per_rank * c.shape.top_k);
  const int64_t L = c.local_experts();
  const int32_t* ids = routing.rank_topk(r);
  RouteGroups g;
  g.y.resize(routes);
  for (size_t i = 0; i < routes; ++i) {
    if (p.ring_rows > 0) {  // per (token, rank, macrobatch of the ring)
      const RouteLocation& at = schedule->routes[static_cast<size_t>(r)][i];
      g.y[i] = at.row < 0 ? -1 : static_cast<int64_t>(at.dst_rank) * (int64_t{1} << 32) + at.row / p.ring_rows;
    } else {  // per (token, rank)
      g.y[i] = ids[i] < 0 ? -1 : ids[i] / L;
    }
  }
  if (p.groups_dx_rows) {  // per (token, other rank, macrobatch); the rank's own tokens a row per route
    g.dx.resize(routes);
    for (size_t i = 0; i < routes; ++i) {
      const int64_t dst = ids[i] < 0 ? r : ids[i] / L;
      g.dx[i] = dst == r ? -1 : (p.ring_rows > 0 ? g.y[i] : dst);
    }
  }
  return g;
}

// The reference of one token of rank r: y, dx, d_topk_scores, and the scale B_t its d_topk_scores
// are bounded in (ReferenceBounds).
struct TokenReference {
  std::vector<double> y, dx, d_topk_scores;
  double score_scale = 0.0;
};

// B_t of a one-token reference step (checks::token_score_scale).
double score_scale(const LayerConfig& c, const ReferenceInputs& in, const ReferenceForwardResult& f,
                   const std::vector<double>& dy) {
  return checks::token_score_scale(in.topk_idx.data(), in.topk_scores.data(), size_t(in.top_k),
                                   f.routed.output.data(), dy.data(), dy.size(), c.router);
}

// The routed experts' gates of token t of rank r: the layer's normalization (reference.hpp).
std::vector<double> token_gates(const LayerConfig& c, const int32_t* ids, const float* scores) {
  const size_t k = static_cast<size_t>(c.shape.top_k);
  double sum = 0.0;
  for (size_t j = 0; j < k; ++j) sum += ids[j] >= 0 ? static_cast<double>(scores[j]) : 0.0;
  const double factor = c.router.normalize ? (sum != 0.0 ? c.router.scale / sum : 0.0) : c.router.scale;
  std::vector<double> gates(k, 0.0);
  for (size_t j = 0; j < k; ++j) gates[j] = ids[j] >= 0 ? factor * static_cast<double>(scores[j]) : 0.0;
  return gates;
}

}  // namespace

CheckPlan plan_check(const LayerConfig& c, const Routing& routing, int64_t step) {
  const int64_t W = c.ep_size, T = c.tokens_per_rank, E = c.shape.num_experts;
  CheckPlan plan;
  const int64_t S = std::min(T, kSampledTokensPerRank);
  plan.tokens.resize(static_cast<size_t>(W));
  for (int64_t r = 0; r < W; ++r) {
    for (int64_t j = 0; j < S; ++j) plan.tokens[static_cast<size_t>(r)].push_back((j * T / S + step) % T);
  }
  std::vector<bool> routed(static_cast<size_t>(E), false);
  for (const int32_t id : routing.topk_idx) {
    if (id >= 0) routed[static_cast<size_t>(id)] = true;
  }
  std::vector<int32_t> experts;
  for (int64_t e = 0; e < E; ++e) {
    if (routed[static_cast<size_t>(e)]) experts.push_back(static_cast<int32_t>(e));
  }
  if (!experts.empty()) plan.expert = experts[static_cast<size_t>(step % static_cast<int64_t>(experts.size()))];
  if (c.shape.num_shared_experts > 0) plan.shared_rank = static_cast<int>(step % W);
  return plan;
}

ReferenceModel::ReferenceModel(const LayerConfig& c, const std::vector<RankWeights>& ranks) : c_(c) {
  CARACAL_CHECK(static_cast<int64_t>(ranks.size()) == c.ep_size, "caracal-soak: reference weights of ", ranks.size(),
                " ranks, expected ", c.ep_size);
  const int64_t L = c.local_experts(), D = c.shape.hidden;
  for (int64_t e = 0; e < c.shape.num_experts; ++e) {
    experts_.push_back(
        widen_expert(ranks[static_cast<size_t>(e / L)], false, static_cast<size_t>(e % L), D, c.shape.intermediate));
  }
  if (c.shape.num_shared_experts > 0) {
    for (const RankWeights& w : ranks) shared_.push_back(widen_expert(w, true, 0, D, c.shape.shared_intermediate));
  }
}

std::vector<OutputCheck> ReferenceModel::check(const Routing& routing, const CheckPlan& plan,
                                               const std::vector<PathLayout>& paths, const std::vector<RankStep>& ranks,
                                               bool bf16_gradients, int threads, const ReferenceBounds& bounds) const {
  const int64_t W = c_.ep_size, T = c_.tokens_per_rank, D = c_.shape.hidden, L = c_.local_experts();
  const size_t k = static_cast<size_t>(c_.shape.top_k), d = static_cast<size_t>(D);
  CARACAL_CHECK(static_cast<int64_t>(ranks.size()) == W, "caracal-soak: a step of ", ranks.size(), " ranks, expected ",
                W);
  for (const RankStep& r : ranks) {
    CARACAL_CHECK(r.paths.size() == paths.size() && r.x.size() == static_cast<size_t>(T) * d &&
                      r.dy.size() == r.x.size() && r.topk_scores.size() == static_cast<size_t>(T) * k,
                  "caracal-soak: a rank's step data has the wrong sizes");
  }
  const bool ring = std::any_of(paths.begin(), paths.end(), [](const PathLayout& p) { return p.ring_rows > 0; });
  const Schedule schedule = ring ? build_schedule(routing, c_.shape.num_experts, 128) : Schedule{};
  std::vector<std::vector<RouteGroups>> groups(paths.size());  // [path][rank]
  for (size_t p = 0; p < paths.size(); ++p) {
    for (int r = 0; r < W; ++r) groups[p].push_back(route_groups(c_, routing, &schedule, paths[p], r));
  }
  const ReferenceOptions base = [&] {
    ReferenceOptions o;
    o.router = c_.router;
    o.round_intermediates_to_bf16 = true;
    return o;
  }();
  const ExpertWeights dummy = ExpertWeights::zeros(D, 1);  // the reference needs a routed expert

  // ---- Tasks: sampled tokens (per path), chunks of the checked routed and shared experts' tokens.
  struct TokenTask {
    size_t path;
    int rank;
    int64_t token;
  };
  std::vector<TokenTask> token_tasks;
  for (size_t p = 0; p < paths.size(); ++p) {
    for (int r = 0; r < W; ++r) {
      for (const int64_t t : plan.tokens[static_cast<size_t>(r)]) token_tasks.push_back({p, r, t});
    }
  }
  struct ChunkTask {
    bool shared;
    int rank;
    std::vector<int64_t> tokens;
  };
  std::vector<ChunkTask> chunks;
  int64_t expert_routes = 0;
  if (plan.expert >= 0) {
    for (int r = 0; r < W; ++r) {
      for (int64_t t = 0; t < T; ++t) {
        const int32_t* ids = routing.rank_topk(r) + t * static_cast<int64_t>(k);
        const auto n = std::count(ids, ids + k, plan.expert);
        if (n == 0) continue;
        expert_routes += n;
        if (chunks.empty() || chunks.back().rank != r || chunks.back().tokens.size() == kTokensPerChunk) {
          chunks.push_back({false, r, {}});
        }
        chunks.back().tokens.push_back(t);
      }
    }
  }
  if (plan.shared_rank >= 0) {
    for (int64_t t = 0; t < T; ++t) {
      if (t % static_cast<int64_t>(kTokensPerChunk) == 0) chunks.push_back({true, plan.shared_rank, {}});
      chunks.back().tokens.push_back(t);
    }
  }

  std::vector<TokenReference> token_refs(token_tasks.size());
  std::vector<ExpertGradients> chunk_grads(chunks.size());
  const size_t tasks = token_tasks.size() + chunks.size();
  parallel_for(tasks, threads, [&](size_t task) {
    if (task < token_tasks.size()) {
      const TokenTask& tt = token_tasks[task];
      const RankStep& rs = ranks[static_cast<size_t>(tt.rank)];
      const size_t first = static_cast<size_t>(tt.token) * k;
      const int32_t* ids = routing.rank_topk(tt.rank) + first;
      ReferenceLayer layer;
      std::vector<int32_t> used;
      ReferenceInputs in;
      in.tokens = 1;
      in.top_k = static_cast<int64_t>(k);
      for (size_t j = 0; j < k; ++j) {
        if (ids[j] < 0) {
          in.topk_idx.push_back(-1);
          continue;
        }
        auto at = std::find(used.begin(), used.end(), ids[j]);
        if (at == used.end()) {
          used.push_back(ids[j]);
          layer.experts.push_back(experts_[static_cast<size_t>(ids[j])]);
          at = used.end() - 1;
        }
        in.topk_idx.push_back(static_cast<int32_t>(at - used.begin()));
      }
      if (layer.experts.empty()) layer.experts.push_back(dummy);
      if (!shared_.empty()) layer.shared = shared_[static_cast<size_t>(tt.rank)];
      in.x = widen(rs.x.data() + static_cast<size_t>(tt.token) * d, d);
      in.topk_scores.assign(rs.topk_scores.begin() + static_cast<int64_t>(first),
                            rs.topk_scores.begin() + static_cast<int64_t>(first + k));
      ReferenceOptions options = base;
      const RouteGroups& g = groups[tt.path][static_cast<size_t>(tt.rank)];
      options.route_groups.assign(g.y.begin() + static_cast<int64_t>(first),
                                  g.y.begin() + static_cast<int64_t>(first + k));
      if (!g.dx.empty()) {
        options.dx_route_groups.assign(g.dx.begin() + static_cast<int64_t>(first),
                                       g.dx.begin() + static_cast<int64_t>(first + k));
      }
      const ReferenceForwardResult f = reference_forward(layer, in, options);
      const std::vector<double> dy = widen(rs.dy.data() + static_cast<size_t>(tt.token) * d, d);
      ReferenceGradients grads = reference_backward(layer, in, f, dy);
      token_refs[task] = {f.y, std::move(grads.dx), std::move(grads.d_topk_scores), score_scale(c_, in, f, dy)};
      return;
    }
    const ChunkTask& ct = chunks[task - token_tasks.size()];
    const RankStep& rs = ranks[static_cast<size_t>(ct.rank)];
    ReferenceLayer layer;
    ReferenceInputs in;
    in.tokens = static_cast<int64_t>(ct.tokens.size());
    in.top_k = static_cast<int64_t>(k);
    ReferenceOptions options = base;
    if (ct.shared) {
      layer.experts.push_back(dummy);
      layer.shared = shared_[static_cast<size_t>(ct.rank)];
      in.topk_idx.assign(ct.tokens.size() * k, -1);
      in.topk_scores.assign(ct.tokens.size() * k, 0.0);
    } else {  // the checked expert's routes as expert 0, with the token's gates as unnormalized scores
      layer.experts.push_back(experts_[static_cast<size_t>(plan.expert)]);
      options.router = RouterNormalization{false, 1.0};
      for (const int64_t t : ct.tokens) {
        const size_t first = static_cast<size_t>(t) * k;
        const int32_t* ids = routing.rank_topk(ct.rank) + first;
        const std::vector<double> gates = token_gates(c_, ids, rs.topk_scores.data() + first);
        for (size_t j = 0; j < k; ++j) {
          in.topk_idx.push_back(ids[j] == plan.expert ? 0 : -1);
          in.topk_scores.push_back(ids[j] == plan.expert ? gates[j] : 0.0);
        }
      }
    }
    std::vector<uint16_t> x, dy;
    for (const int64_t t : ct.tokens) {
      const auto row = static_cast<int64_t>(static_cast<size_t>(t) * d);
      x.insert(x.end(), rs.x.begin() + row, rs.x.begin() + row + D);
      dy.insert(dy.end(), rs.dy.begin() + row, rs.dy.begin() + row + D);
    }
    in.x = widen(x.data(), x.size());
    const ReferenceForwardResult f = reference_forward(layer, in, options);
    ReferenceGradients grads = reference_backward(layer, in, f, widen(dy.data(), dy.size()));
    chunk_grads[task - token_tasks.size()] = ct.shared ? std::move(*grads.d_shared) : std::move(grads.d_experts[0]);
  });

  // ---- Comparisons.
  std::vector<OutputCheck> out;
  const auto weight_bound = bounds.weight_gradient + (bf16_gradients ? bounds.bf16_rounding : 0.0);
  // Sums of the chunks of one kind, interleaved as the layer stores gate and up.
  const auto summed = [&](bool shared, std::vector<double>& gate_up, std::vector<double>& down) {
    const int64_t I = shared ? c_.shape.shared_intermediate : c_.shape.intermediate;
    const size_t n = static_cast<size_t>(I) * d;
    std::vector<double> gate(n, 0.0), up(n, 0.0);
    down.assign(n, 0.0);
    for (size_t i = 0; i < chunks.size(); ++i) {
      if (chunks[i].shared != shared) continue;
      for (size_t j = 0; j < n; ++j) {
        gate[j] += chunk_grads[i].gate[j];
        up[j] += chunk_grads[i].up[j];
        down[j] += chunk_grads[i].down[j];
      }
    }
    gate_up.assign(2 * n, 0.0);
    interleave_gate_up_weights_host(gate.data(), up.data(), gate_up.data(), 1, I, D);
  };
  std::vector<double> expert_gate_up, expert_down, shared_gate_up, shared_down;
  if (plan.expert >= 0) summed(false, expert_gate_up, expert_down);
  if (plan.shared_rank >= 0) summed(true, shared_gate_up, shared_down);
  const auto compare = [](const std::vector<float>& got, const std::vector<double>& want) {
    Frobenius f;
    if (got.size() != want.size()) return static_cast<double>(INFINITY);
    for (size_t i = 0; i < got.size(); ++i) f.add(static_cast<double>(got[i]), want[i]);
    return f.relative();
  };
  for (size_t p = 0; p < paths.size(); ++p) {
    // Per-token outputs over every sampled token; the worst token row named.
    struct Worst {
      double error = -1.0;
      int rank = 0;
      int64_t token = 0;
    };
    Frobenius y, dx;
    Worst worst_y, worst_dx;
    double scores = 0.0;  // max |got - want| / B_t; empty slots and tokens of B_t = 0 exact
    for (size_t i = 0; i < token_tasks.size(); ++i) {
      const TokenTask& tt = token_tasks[i];
      if (tt.path != p) continue;
      const PathOutputs& o = ranks[static_cast<size_t>(tt.rank)].paths[p];
      const size_t row = static_cast<size_t>(tt.token) * d, slots = static_cast<size_t>(tt.token) * k;
      CARACAL_CHECK(o.y.size() == static_cast<size_t>(T) * d && o.dx.size() == o.y.size() &&
                        o.d_topk_scores.size() == static_cast<size_t>(T) * k,
                    "caracal-soak: a rank's ", paths[p].name, " outputs have the wrong sizes");
      const auto row_error = [&](Frobenius& total, Worst& worst, const std::vector<uint16_t>& got,
                                 const std::vector<double>& want) {
        Frobenius one;
        for (size_t j = 0; j < d; ++j) one.add(static_cast<double>(bf16_to_float(got[row + j])), want[j]);
        total.err2 += one.err2;
        total.ref2 += one.ref2;
        const double e = one.relative();
        if (std::isnan(e) || e > worst.error) worst = {std::isnan(e) ? INFINITY : e, tt.rank, tt.token};
      };
      row_error(y, worst_y, o.y, token_refs[i].y);
      row_error(dx, worst_dx, o.dx, token_refs[i].dx);
      const int32_t* ids = routing.rank_topk(tt.rank) + slots;
      for (size_t j = 0; j < k; ++j) {
        const double got = o.d_topk_scores[slots + j], want = token_refs[i].d_topk_scores[j];
        const double scale = token_refs[i].score_scale;
        const bool exact = ids[j] < 0 || scale == 0.0;  // empty slots, and tokens of no scale: 0 exactly
        const double e = exact ? (got == want ? 0.0 : INFINITY) : std::abs(got - want) / scale;
        scores = std::isnan(e) ? INFINITY : std::max(scores, e);
      }
    }
    const std::string sample =
        std::to_string(plan.tokens.empty() ? 0 : plan.tokens[0].size()) + " sampled tokens of each rank";
    const auto worst_text = [&](const Worst& w) {
      char text[96];
      std::snprintf(text, sizeof text, "; worst: rank %d token %lld, %.3g", w.rank, static_cast<long long>(w.token),
                    w.error);
      return std::string(text);
    };
    const std::string& name = paths[p].name;
    out.push_back({name, "y", y.relative(), bounds.y, sample + worst_text(worst_y)});
    out.push_back({name, "dx", dx.relative(), bounds.dx, sample + worst_text(worst_dx)});
    out.push_back({name, "d_scores", scores, bounds.d_topk_scores, sample + ", per element in units of B_t"});
    if (plan.expert >= 0) {
      const PathOutputs& o = ranks[static_cast<size_t>(plan.expert / L)].paths[p];
      const std::string what = "expert " + std::to_string(plan.expert) + " (rank " + std::to_string(plan.expert / L) +
                               "), " + std::to_string(expert_routes) + " routes";
      out.push_back({name, "d_w_gate_up", compare(o.expert_gate_up, expert_gate_up), weight_bound, what});
      out.push_back({name, "d_w_down", compare(o.expert_down, expert_down), weight_bound, what});
    }
    if (plan.shared_rank >= 0) {
      const PathOutputs& o = ranks[static_cast<size_t>(plan.shared_rank)].paths[p];
      const std::string what = "rank " + std::to_string(plan.shared_rank) + "'s shared expert";
      out.push_back({name, "d_shared_w_gate_up", compare(o.shared_gate_up, shared_gate_up), weight_bound, what});
      out.push_back({name, "d_shared_w_down", compare(o.shared_down, shared_down), weight_bound, what});
    }
  }
  return out;
}

}  // namespace caracal::soak
