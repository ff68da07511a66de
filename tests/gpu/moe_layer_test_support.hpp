#pragma once
// Shared by the MoELayer GPU tests: the test shapes, random weights and steps (routing + inputs of
// every rank), per-rank device buffers, the fp64 reference of a whole step (reference.hpp,
// bf16-rounding mode) and the comparisons against it.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <future>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "caracal/bf16.hpp"
#include "caracal/comm/cuda_check.hpp"
#include "caracal/comm/cuda_memory.hpp"
#include "caracal/comm/loopback_world.hpp"
#include "caracal/layer_config.hpp"
#include "caracal/moe_layer.hpp"
#include "caracal/reference.hpp"
#include "caracal/routing.hpp"
#include "caracal/schedule.hpp"
#include "exchange_test_support.hpp"
#include "layer/layer_experiments.hpp"  // src/
#include "layer_bounds.hpp"             // bench/
#include "layer_reference_options.hpp"  // bench/
#include "output_checks.hpp"

namespace caracal::layer_test {

using exchange_test::fresh_seed;
using exchange_test::RoutingCase;
using exchange_test::seed_note;
using exchange_test::Stream;
using exchange_test::TracedSeed;

inline constexpr RouterNormalization kNormalized{true, 1.0};
inline constexpr RouterNormalization kNormalizedScaled{true, 2.5};  // DeepSeek-V3's routed_scaling_factor
inline constexpr RouterNormalization kUnnormalized{false, 2.5};

inline constexpr int kHidden = 256;
inline constexpr int kIntermediate = 128;
inline constexpr int kSharedIntermediate = 192;     // differs from I, so a mix-up shows
inline constexpr int kFp8SharedIntermediate = 384;  // FP8 layers: a multiple of 128, differs from I and D

// ---- Shapes -----------------------------------------------------------------------------------

struct LayerCase {
  std::string name;
  int world = 1;
  int tokens = 37;   // per rank
  int experts = 8;
  int top_k = 2;
  bool shared = true;
  bool shared_scale = false;  // the forward gets a per-token shared-output scale
  RouterNormalization router;
  RoutingCase routing = RoutingCase::kUniform;
  Precision precision = Precision::kBF16;
};

inline void PrintTo(const LayerCase& c, std::ostream* os) { *os << c.name; }

// The shared expert's I of a case (FP8 layers need multiples of 128).
inline int shared_intermediate_of(const LayerCase& c) {
  return c.precision == Precision::kFP8 ? kFp8SharedIntermediate : kSharedIntermediate;
}

inline LayerConfig config_of(const LayerCase& c) {
  LayerConfig config;
  config.shape.hidden = kHidden;
  config.shape.intermediate = kIntermediate;
  config.shape.num_experts = c.experts;
  config.shape.top_k = c.top_k;
  config.shape.num_shared_experts = c.shared ? 1 : 0;
  config.shape.shared_intermediate = c.shared ? shared_intermediate_of(c) : 0;
  config.ep_size = c.world;
  config.tokens_per_rank = c.tokens;
  config.router = c.router;
  config.precision = c.precision;
  return config;
}

// ---- Host data ----------------------------------------------------------------------------------

using Bf16 = std::vector<uint16_t>;  // bf16 bits, row-major

inline Bf16 random_bf16(size_t count, double bound, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> value(-bound, bound);
  Bf16 out(count);
  for (uint16_t& v : out) v = bf16_bits(static_cast<float>(value(rng)));
  return out;
}

inline std::vector<float> random_floats(size_t count, double low, double high, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> value(low, high);
  std::vector<float> out(count);
  for (float& v : out) v = static_cast<float>(value(rng));
  return out;
}

// All E routed experts and the shared expert, as separate gate / up / down matrices.
struct HostWeights {
  Bf16 gate, up, down;                       // [E][I][D], [E][I][D], [E][D][I]
  Bf16 shared_gate, shared_up, shared_down;  // [Is][D], [Is][D], [D][Is] (empty without one)
};

inline HostWeights random_weights(const LayerCase& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const size_t E = static_cast<size_t>(c.experts), D = kHidden, I = kIntermediate, Is = shared_intermediate_of(c);
  HostWeights w;
  w.gate = random_bf16(E * I * D, std::sqrt(3.0 / D), rng);
  w.up = random_bf16(E * I * D, std::sqrt(3.0 / D), rng);
  w.down = random_bf16(E * D * I, std::sqrt(3.0 / I), rng);
  if (c.shared) {
    w.shared_gate = random_bf16(Is * D, std::sqrt(3.0 / D), rng);
    w.shared_up = random_bf16(Is * D, std::sqrt(3.0 / D), rng);
    w.shared_down = random_bf16(D * Is, std::sqrt(3.0 / static_cast<double>(Is)), rng);
  }
  return w;
}

// One training step's inputs on every rank.
struct HostStep {
  Routing routing;
  std::vector<Bf16> x, dy;                         // [W][T*D]
  std::vector<std::vector<float>> scores;          // [W][T*k]
  std::vector<std::vector<float>> shared_scale;    // [W][T], or [W][] without one
};

inline HostStep random_step(const LayerCase& c, RoutingCase routing, uint64_t seed) {
  std::mt19937_64 rng(seed ^ 0x9e3779b97f4a7c15ull);
  HostStep s;
  s.routing = exchange_test::make_test_routing(routing, c.world, c.tokens, c.top_k, c.experts, seed);
  const size_t T = static_cast<size_t>(c.tokens), k = static_cast<size_t>(c.top_k);
  for (int r = 0; r < c.world; ++r) {
    s.x.push_back(random_bf16(T * kHidden, 1.0, rng));
    s.dy.push_back(random_bf16(T * kHidden, 1.0, rng));
    s.scores.push_back(random_floats(T * k, 0.05, 1.0, rng));
    s.shared_scale.push_back(c.shared_scale ? random_floats(T, 0.25, 1.5, rng) : std::vector<float>{});
  }
  return s;
}

// The weights and one step of `c` from one fresh seed, which every failure reported while this
// lives names.
struct SeededStep {
  SeededStep(const LayerCase& c, RoutingCase routing)
      : weights(random_weights(c, seed.value())), step(random_step(c, routing, seed.value())) {}
  const TracedSeed seed;
  const HostWeights weights;
  const HostStep step;
};

// ---- Device buffers ------------------------------------------------------------------------------

template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  explicit DeviceArray(size_t count)
      : memory_(comm::device_alloc<T>(count == 0 ? 1 : count, "cudaMalloc(test buffer)")), count_(count) {}
  T* get() const { return memory_.get(); }
  size_t size() const { return count_; }
  void upload(const std::vector<T>& values) const {
    EXPECT_EQ(values.size(), count_);
    check_cuda(cudaMemcpy(get(), values.data(), values.size() * sizeof(T), cudaMemcpyHostToDevice),
               "cudaMemcpy(upload)");
  }
  std::vector<T> download() const {
    std::vector<T> values(count_);
    check_cuda(cudaMemcpy(values.data(), get(), count_ * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy(download)");
    return values;
  }
  void poison() const {
    check_cuda(cudaMemset(get(), exchange_test::kNanByte, count_ * sizeof(T)), "cudaMemset(poison)");
  }

 private:
  comm::DeviceMemory<T> memory_;
  size_t count_ = 0;
};

inline const __nv_bfloat16* bf16_ptr(const DeviceArray<uint16_t>& a) {
  return reinterpret_cast<const __nv_bfloat16*>(a.get());
}
inline __nv_bfloat16* bf16_out(const DeviceArray<uint16_t>& a) { return reinterpret_cast<__nv_bfloat16*>(a.get()); }

// What one rank's forward and backward produce, downloaded.
struct RankOutputs {
  Bf16 y, dx;
  std::vector<float> d_scores, d_w_gate_up, d_w_down, d_shared_w_gate_up, d_shared_w_down, d_shared_scale;
};

// One rank's weights, inputs and outputs on the device.
struct RankBuffers {
  DeviceArray<uint16_t> w_gate_up, w_down, shared_w_gate_up, shared_w_down;
  DeviceArray<uint16_t> x, dy, y, dx;
  DeviceArray<int32_t> topk_idx;
  DeviceArray<float> scores, shared_scale, d_scores, d_shared_scale;
  DeviceArray<float> d_w_gate_up, d_w_down, d_shared_w_gate_up, d_shared_w_down;

  gemm::GateUpLayout gate_up_layout;  // of w_gate_up (and so of d_w_gate_up)

  RankBuffers(const LayerCase& c, const HostWeights& w, int rank,
              gemm::GateUpLayout layout = gemm::GateUpLayout::kInterleaved)
      : gate_up_layout(layout) {
    const size_t T = static_cast<size_t>(c.tokens), k = static_cast<size_t>(c.top_k), D = kHidden,
                 I = kIntermediate, Is = shared_intermediate_of(c);
    const size_t L = static_cast<size_t>(c.experts / c.world);
    const size_t first = static_cast<size_t>(rank) * L;
    Bf16 gate_up(L * 2 * I * D);
    if (layout == gemm::GateUpLayout::kHalves) {  // W_gate then W_up for every expert
      for (size_t e = 0; e < L; ++e) {
        std::copy_n(w.gate.begin() + static_cast<int64_t>((first + e) * I * D), I * D,
                    gate_up.begin() + static_cast<int64_t>(2 * e * I * D));
        std::copy_n(w.up.begin() + static_cast<int64_t>((first + e) * I * D), I * D,
                    gate_up.begin() + static_cast<int64_t>((2 * e + 1) * I * D));
      }
    } else {
      interleave_gate_up_weights_host(w.gate.data() + first * I * D, w.up.data() + first * I * D, gate_up.data(),
                                      static_cast<int64_t>(L), kIntermediate, kHidden);
    }
    w_gate_up = DeviceArray<uint16_t>(gate_up.size());
    w_gate_up.upload(gate_up);
    w_down = DeviceArray<uint16_t>(L * D * I);
    w_down.upload(Bf16(w.down.begin() + static_cast<int64_t>(first * D * I),
                       w.down.begin() + static_cast<int64_t>((first + L) * D * I)));
    x = DeviceArray<uint16_t>(T * D);
    dy = DeviceArray<uint16_t>(T * D);
    y = DeviceArray<uint16_t>(T * D);
    dx = DeviceArray<uint16_t>(T * D);
    topk_idx = DeviceArray<int32_t>(T * k);
    scores = DeviceArray<float>(T * k);
    d_scores = DeviceArray<float>(T * k);
    d_w_gate_up = DeviceArray<float>(L * 2 * I * D);
    d_w_down = DeviceArray<float>(L * D * I);
    if (c.shared) {
      Bf16 shared_gate_up(2 * Is * D);
      interleave_gate_up_weights_host(w.shared_gate.data(), w.shared_up.data(), shared_gate_up.data(), 1,
                                      shared_intermediate_of(c), kHidden);
      shared_w_gate_up = DeviceArray<uint16_t>(shared_gate_up.size());
      shared_w_gate_up.upload(shared_gate_up);
      shared_w_down = DeviceArray<uint16_t>(D * Is);
      shared_w_down.upload(w.shared_down);
      d_shared_w_gate_up = DeviceArray<float>(2 * Is * D);
      d_shared_w_down = DeviceArray<float>(D * Is);
    }
    if (c.shared_scale) {
      shared_scale = DeviceArray<float>(T);
      d_shared_scale = DeviceArray<float>(T);
    }
  }

  void upload(const HostStep& s, int rank) const {
    const auto r = static_cast<size_t>(rank);
    const int32_t* ids = s.routing.rank_topk(rank);
    x.upload(s.x[r]);
    dy.upload(s.dy[r]);
    topk_idx.upload(std::vector<int32_t>(ids, ids + s.scores[r].size()));
    scores.upload(s.scores[r]);
    if (shared_scale.get() != nullptr) shared_scale.upload(s.shared_scale[r]);
  }

  void poison_outputs() const {
    for (const auto* a : {&y, &dx}) a->poison();
    for (const auto* a : {&d_scores, &d_w_gate_up, &d_w_down}) a->poison();
    for (const auto* a : {&d_shared_w_gate_up, &d_shared_w_down, &d_shared_scale}) {
      if (a->get() != nullptr) a->poison();
    }
  }

  RankOutputs download() const {
    RankOutputs o;
    o.y = y.download();
    o.dx = dx.download();
    o.d_scores = d_scores.download();
    o.d_w_gate_up = d_w_gate_up.download();
    o.d_w_down = d_w_down.download();
    if (d_shared_w_gate_up.get() != nullptr) {
      o.d_shared_w_gate_up = d_shared_w_gate_up.download();
      o.d_shared_w_down = d_shared_w_down.download();
    }
    if (d_shared_scale.get() != nullptr) o.d_shared_scale = d_shared_scale.download();
    return o;
  }

  MoEForwardArgs forward_args() const {
    MoEForwardArgs a;
    a.x = bf16_ptr(x);
    a.topk_idx = topk_idx.get();
    a.topk_scores = scores.get();
    a.shared_scale = shared_scale.get();
    a.weights.w_gate_up = bf16_ptr(w_gate_up);
    a.weights.w_down = bf16_ptr(w_down);
    a.weights.w_gate_up_layout = gate_up_layout;
    a.weights.shared_w_gate_up = bf16_ptr(shared_w_gate_up);
    a.weights.shared_w_down = bf16_ptr(shared_w_down);
    a.y = bf16_out(y);
    return a;
  }

  MoEBackwardArgs backward_args() const {
    MoEBackwardArgs a;
    a.dy = bf16_ptr(dy);
    a.dx = bf16_out(dx);
    a.d_topk_scores = d_scores.get();
    a.d_w_gate_up = d_w_gate_up.get();
    a.d_w_down = d_w_down.get();
    a.d_shared_w_gate_up = d_shared_w_gate_up.get();
    a.d_shared_w_down = d_shared_w_down.get();
    a.d_shared_scale = d_shared_scale.get();
    return a;
  }
};

// Every local rank's buffers of one layer.
struct WorldBuffers {
  std::vector<RankBuffers> ranks;

  WorldBuffers(const LayerCase& c, const HostWeights& w, const comm::World& world,
               gemm::GateUpLayout layout = gemm::GateUpLayout::kInterleaved) {
    for (int l = 0; l < world.local_ranks(); ++l) ranks.emplace_back(c, w, world.first_local_rank() + l, layout);
  }
  std::vector<MoEForwardArgs> forward_args() const {
    std::vector<MoEForwardArgs> out;
    for (const RankBuffers& r : ranks) out.push_back(r.forward_args());
    return out;
  }
  std::vector<MoEBackwardArgs> backward_args() const {
    std::vector<MoEBackwardArgs> out;
    for (const RankBuffers& r : ranks) out.push_back(r.backward_args());
    return out;
  }
  // Uploads the step's inputs and poisons every output, then waits (the copies run on the legacy
  // stream, which does not order against the tests' non-blocking streams).
  void prepare(const HostStep& s, const comm::World& world) const {
    for (size_t l = 0; l < ranks.size(); ++l) {
      ranks[l].upload(s, world.first_local_rank() + static_cast<int>(l));
      ranks[l].poison_outputs();
    }
    exchange_test::settle();
  }
  std::vector<RankOutputs> download() const {
    std::vector<RankOutputs> out;
    for (const RankBuffers& r : ranks) out.push_back(r.download());
    return out;
  }
};

// A layer of case `c` on a loopback world of its own, with every local rank's buffers (weights
// uploaded).
// A layer's options and the fused path's test switches (src/layer/layer_experiments.hpp).
struct LayerSetup {
  MoELayerOptions options;
  layer::LayerExperiments experiments;
  gemm::GateUpLayout gate_up_layout = gemm::GateUpLayout::kInterleaved;  // of the weights given
};

// v1's separate launches; rows_per_route: the exchange sends a row per route.
inline LayerSetup v1_setup(bool rows_per_route = false) {
  LayerSetup o;
  o.options.fused_forward = false;
  o.experiments.rows_per_route = rows_per_route;
  return o;
}

// The fused path with `comm_ctas` pulling CTAs per rank and a ring of `ring_rows` rows (0: the
// defaults); pull_all_rows: every row pulled, none copied by idle warps; rows_per_route: as above.
inline LayerSetup fused_setup(int comm_ctas = 0, int ring_rows = 0, bool pull_all_rows = false,
                              bool rows_per_route = false) {
  LayerSetup o;
  o.options.fused_comm_ctas = comm_ctas;
  o.options.ring_rows = ring_rows;
  o.experiments.pull_all_rows = pull_all_rows;
  o.experiments.rows_per_route = rows_per_route;
  return o;
}

struct LoopbackLayer {
  LoopbackLayer(const LayerCase& c, const HostWeights& weights, const MoELayerOptions& options = {})
      : LoopbackLayer(c, weights, LayerSetup{options, {}}) {}
  LoopbackLayer(const LayerCase& c, const HostWeights& weights, const LayerSetup& setup)
      : world(c.world, layer::ExperimentalLayer::memory(config_of(c), setup.options, setup.experiments).heap),
        owned_layer(layer::ExperimentalLayer::make(config_of(c), world, setup.options, setup.experiments)),
        layer(*owned_layer),
        buffers(c, weights, world, setup.gate_up_layout) {}
  comm::LoopbackWorld world;
  std::unique_ptr<MoELayer> owned_layer;
  MoELayer& layer;
  WorldBuffers buffers;
};

// Forward then backward of every local rank on `stream`, waited for, with the layer's check.
inline void run_step(MoELayer& layer, const WorldBuffers& buffers, const exchange_test::Stream& stream) {
  const MoEContext context = layer.forward(buffers.forward_args(), stream.get());
  layer.backward(buffers.backward_args(), context, stream.get());
  stream.sync();
  layer.check();
}

// One step of `step` on a loopback layer of its own (weights `weights`, `options`), checked; every
// rank's outputs.
inline std::vector<RankOutputs> run_once(const LayerCase& c, const HostWeights& weights, const HostStep& step,
                                         const LayerSetup& setup) {
  LoopbackLayer l(c, weights, setup);
  l.buffers.prepare(step, l.world);
  const Stream stream;
  run_step(l.layer, l.buffers, stream);
  return l.buffers.download();
}
// The same for a seeded step (its weights and step).
inline std::vector<RankOutputs> run_once(const LayerCase& c, const HostWeights& weights, const HostStep& step,
                                         const MoELayerOptions& options = {}) {
  return run_once(c, weights, step, LayerSetup{options, {}});
}
inline std::vector<RankOutputs> run_once(const LayerCase& c, const SeededStep& s, const LayerSetup& setup) {
  return run_once(c, s.weights, s.step, setup);
}
inline std::vector<RankOutputs> run_once(const LayerCase& c, const SeededStep& s, const MoELayerOptions& options = {}) {
  return run_once(c, s.weights, s.step, LayerSetup{options, {}});
}

// Parameterized layer tests are named by their case.
inline std::string case_name(const testing::TestParamInfo<LayerCase>& info) { return info.param.name; }

// ---- The fp64 reference of a step ---------------------------------------------------------------------

inline std::vector<double> widen(const Bf16& bits) { return from_bf16_bits(bits); }

inline ReferenceLayer reference_layer(const LayerCase& c, const HostWeights& w) {
  const size_t D = kHidden, I = kIntermediate;
  ReferenceLayer layer;
  for (size_t e = 0; e < static_cast<size_t>(c.experts); ++e) {
    ExpertWeights x;
    x.hidden = kHidden;
    x.intermediate = kIntermediate;
    const auto in = static_cast<int64_t>(e * I * D);
    const auto n = static_cast<int64_t>(I * D);
    x.gate = widen(Bf16(w.gate.begin() + in, w.gate.begin() + in + n));
    x.up = widen(Bf16(w.up.begin() + in, w.up.begin() + in + n));
    x.down = widen(Bf16(w.down.begin() + in, w.down.begin() + in + n));
    layer.experts.push_back(std::move(x));
  }
  if (c.shared) {
    layer.shared = ExpertWeights{kHidden, shared_intermediate_of(c), widen(w.shared_gate), widen(w.shared_up),
                                 widen(w.shared_down)};
  }
  return layer;
}

struct RankExpected {
  ReferenceInputs inputs;
  ReferenceForwardResult forward;
  ReferenceGradients grads;
};

struct StepExpected {
  std::vector<RankExpected> ranks;             // [W]
  std::vector<ExpertGradients> routed;         // [E]: summed over the home ranks
};

// The reference of every rank (in parallel: they are independent), and the routed experts'
// weight gradients summed over the ranks whose tokens they served, for a layer that rounds as
// `rounding` says (checks::LayerRounding; fp8_experts: an FP8 layer's quantized operands).
inline StepExpected reference_step(const LayerCase& c, const ReferenceLayer& layer, const HostStep& s,
                                   const checks::LayerRounding& rounding) {
  const std::vector<ReferenceOptions> options =
      checks::layer_reference_options(c.router, s.routing, c.experts, rounding);
  std::vector<std::future<RankExpected>> futures;
  for (int r = 0; r < c.world; ++r) {
    futures.push_back(std::async(std::launch::async, [&, r]() {
      const auto i = static_cast<size_t>(r);
      RankExpected e;
      e.inputs.tokens = c.tokens;
      e.inputs.top_k = c.top_k;
      e.inputs.x = widen(s.x[i]);
      const int32_t* ids = s.routing.rank_topk(r);
      e.inputs.topk_idx.assign(ids, ids + s.scores[i].size());
      e.inputs.topk_scores.assign(s.scores[i].begin(), s.scores[i].end());
      e.inputs.shared_scale.assign(s.shared_scale[i].begin(), s.shared_scale[i].end());
      e.forward = reference_forward(layer, e.inputs, options[i]);
      e.grads = reference_backward(layer, e.inputs, e.forward, widen(s.dy[i]));
      return e;
    }));
  }
  StepExpected out;
  for (auto& f : futures) out.ranks.push_back(f.get());
  for (int e = 0; e < c.experts; ++e) {
    ExpertGradients sum = ExpertGradients::zeros(kHidden, kIntermediate);
    for (const RankExpected& r : out.ranks) {
      const ExpertGradients& g = r.grads.d_experts[static_cast<size_t>(e)];
      for (size_t i = 0; i < sum.gate.size(); ++i) {
        sum.gate[i] += g.gate[i];
        sum.up[i] += g.up[i];
        sum.down[i] += g.down[i];
      }
    }
    out.routed.push_back(std::move(sum));
  }
  return out;
}
// The same with the rounding's fields: `ring_rows` > 0: y as a fused layer with that ring sums it
// (one bf16 row per token, rank and macrobatch); 0: per (token, rank); `per_route`: a row per route
// (layer::LayerExperiments::rows_per_route). `dx_groups`: dx as a layer that groups its dx rows
// sums it (MoELayer::groups_dx_rows: one bf16 row per token, other rank and macrobatch of
// ring_rows; 0: a ring that holds the step).
inline StepExpected reference_step(const LayerCase& c, const ReferenceLayer& layer, const HostStep& s,
                                   int64_t ring_rows = 0, bool per_route = false, bool dx_groups = false) {
  return reference_step(c, layer, s, checks::LayerRounding{ring_rows, per_route, dx_groups, false});
}

// ---- Comparisons ------------------------------------------------------------------------------------

using checks::kLayerBounds;
using checks::LayerBounds;

// One expert's fp32 gradient block [rows][cols] (as one row of the check: per expert).
inline void add_block(test::OutputError& e, const float* got, const std::vector<double>& want) {
  for (size_t i = 0; i < want.size(); ++i) e.add(got[i], want[i]);
  e.end_row();
}

// One rank's d_topk_scores against the reference, per element (checks::score_gradient_error).
inline std::vector<std::string> score_gradient_failures(const std::vector<float>& got, const RankExpected& e,
                                                        const RouterNormalization& router, const Bf16& dy,
                                                        const LayerBounds& bounds, bool report) {
  const checks::ScoreGradientError m =
      checks::score_gradient_error("d_topk_scores", got, e.inputs, e.forward, e.grads, router, dy, bounds);
  if (report) {
    std::cout << "  error d_topk_scores: frobenius " << m.frobenius << ", worst |error| / B_t " << m.worst_over_bt
              << " [" << test::current_test() << "]\n";
  }
  return m.failures();
}

// Every output of every rank against the reference; what is out of bounds (empty: all good).
// `report`: print the measured errors (off when checking deliberately wrong results).
inline std::vector<std::string> step_failures(const LayerCase& c, const HostStep& s, const StepExpected& want,
                                              const std::vector<RankOutputs>& got, bool report = true,
                                              const LayerBounds& bounds = kLayerBounds) {
  std::vector<std::string> out;
  if (got.size() != static_cast<size_t>(c.world)) return {"wrong number of ranks"};
  const size_t L = static_cast<size_t>(c.experts / c.world), T = static_cast<size_t>(c.tokens), D = kHidden,
               I = kIntermediate;
  const auto bf16_at = [](const Bf16& v) { return [&v](size_t i) { return static_cast<double>(bf16_to_float(v[i])); }; };
  for (size_t r = 0; r < got.size(); ++r) {
    const std::string rank = "rank " + std::to_string(r) + " ";
    const RankOutputs& o = got[r];
    const RankExpected& e = want.ranks[r];
    if (o.y.size() != T * D || o.dx.size() != T * D) return {rank + "y or dx has the wrong size"};
    test::append(out, test::compare_rows(rank + "y", bf16_at(o.y), e.forward.y, T, D, bounds.y, report));
    test::append(out, test::compare_rows(rank + "dx", bf16_at(o.dx), e.grads.dx, T, D, bounds.dx, report));
    test::append(out, score_gradient_failures(o.d_scores, e, c.router, s.dy[r], bounds, report));
    std::vector<float> gate(L * I * D), up(L * I * D);
    deinterleave_gate_up_host(o.d_w_gate_up.data(), gate.data(), up.data(), static_cast<int64_t>(L), kIntermediate,
                              kHidden);
    test::OutputError d_gate(rank + "d_w_gate"), d_up(rank + "d_w_up"), d_down(rank + "d_w_down");
    for (size_t l = 0; l < L; ++l) {
      const ExpertGradients& g = want.routed[r * L + l];
      add_block(d_gate, gate.data() + l * I * D, g.gate);
      add_block(d_up, up.data() + l * I * D, g.up);
      add_block(d_down, o.d_w_down.data() + l * D * I, g.down);
    }
    for (const test::OutputError* e2 : {&d_gate, &d_up, &d_down}) {
      test::append(out, e2->failures(bounds.weight_grad, report));
    }
    if (c.shared) {
      const size_t Is = shared_intermediate_of(c);
      std::vector<float> shared_gate(Is * D), shared_up(Is * D);
      deinterleave_gate_up_host(o.d_shared_w_gate_up.data(), shared_gate.data(), shared_up.data(), 1,
                                shared_intermediate_of(c), kHidden);
      test::OutputError sg(rank + "d_shared_w_gate"), su(rank + "d_shared_w_up"), sd(rank + "d_shared_w_down");
      add_block(sg, shared_gate.data(), e.grads.d_shared->gate);
      add_block(su, shared_up.data(), e.grads.d_shared->up);
      add_block(sd, o.d_shared_w_down.data(), e.grads.d_shared->down);
      for (const test::OutputError* e2 : {&sg, &su, &sd}) test::append(out, e2->failures(bounds.weight_grad, report));
    }
    if (c.shared_scale) {
      test::append(out, test::compare_rows(
                            rank + "d_shared_scale", [&](size_t i) { return static_cast<double>(o.d_shared_scale[i]); },
                            e.grads.d_shared_scale, 1, T, bounds.shared_scale_grad, report));
    }
  }
  return out;
}

inline void expect_step_matches(const LayerCase& c, const HostStep& s, const StepExpected& want,
                                const std::vector<RankOutputs>& got) {
  const std::vector<std::string> failures = step_failures(c, s, want, got);
  for (const std::string& f : failures) ADD_FAILURE() << f;
}

// The reference of step `s` as a loopback layer built with `options` computes it: y's groups per
// macrobatch of its ring, dx's per (token, other rank, macrobatch) where it groups them.
inline StepExpected reference_for(const LayerCase& c, const HostWeights& weights, const HostStep& s,
                                  const LayerSetup& setup) {
  const LoopbackLayer l(c, weights, setup);
  return reference_step(c, reference_layer(c, weights), s, l.layer.ring_rows(), setup.experiments.rows_per_route,
                        l.layer.groups_dx_rows());
}
inline StepExpected reference_for(const LayerCase& c, const HostWeights& weights, const HostStep& s,
                                  const MoELayerOptions& options = {}) {
  return reference_for(c, weights, s, LayerSetup{options, {}});
}

// One step on `layer` (fresh routing and inputs for `routing`) on `stream`, checked against the
// reference of `weights`.
inline void check_step(const LayerCase& c, MoELayer& layer, const WorldBuffers& buffers, const HostWeights& weights,
                       RoutingCase routing, const Stream& stream = Stream()) {
  const TracedSeed seed(std::string(exchange_test::name_of(routing)) + ", ");
  const HostStep step = random_step(c, routing, seed.value());
  buffers.prepare(step, layer.world());
  ASSERT_NO_THROW(run_step(layer, buffers, stream));
  expect_step_matches(
      c, step, reference_step(c, reference_layer(c, weights), step, layer.ring_rows(), false, layer.groups_dx_rows()),
      buffers.download());
}

// ---- Bitwise comparison -------------------------------------------------------------------------------

template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

inline void expect_same_bits(const std::vector<RankOutputs>& a, const std::vector<RankOutputs>& b,
                             const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t r = 0; r < a.size(); ++r) {
    SCOPED_TRACE(what + ", rank " + std::to_string(r));
    EXPECT_TRUE(same_bits(a[r].y, b[r].y)) << "y";
    EXPECT_TRUE(same_bits(a[r].dx, b[r].dx)) << "dx";
    EXPECT_TRUE(same_bits(a[r].d_scores, b[r].d_scores)) << "d_topk_scores";
    EXPECT_TRUE(same_bits(a[r].d_w_gate_up, b[r].d_w_gate_up)) << "d_w_gate_up";
    EXPECT_TRUE(same_bits(a[r].d_w_down, b[r].d_w_down)) << "d_w_down";
    EXPECT_TRUE(same_bits(a[r].d_shared_w_gate_up, b[r].d_shared_w_gate_up)) << "d_shared_w_gate_up";
    EXPECT_TRUE(same_bits(a[r].d_shared_w_down, b[r].d_shared_w_down)) << "d_shared_w_down";
    EXPECT_TRUE(same_bits(a[r].d_shared_scale, b[r].d_shared_scale)) << "d_shared_scale";
  }
}

// Every output but y (and with `dx_aside` dx) the same bits in `a` and `b`: the gradients do not
// read y, whose sums per (token, rank) depend on where a ring's macrobatches cut a token's rows
// (group_sum.cuh); dx's too where a layer groups its dx rows (MoELayer::groups_dx_rows: the fused
// backward at W > 1) and the other does not, or cuts other macrobatches.
inline void expect_same_bits_but_y(const std::vector<RankOutputs>& a, std::vector<RankOutputs> b,
                                   const std::string& what, bool dx_aside = false) {
  for (size_t r = 0; r < a.size() && r < b.size(); ++r) {
    b[r].y = a[r].y;
    if (dx_aside) b[r].dx = a[r].dx;
  }
  expect_same_bits(a, b, what + (dx_aside ? ", y and dx aside" : ", y aside"));
}

// Every output but dx the same bits (see expect_same_bits_but_y).
inline void expect_same_bits_but_dx(const std::vector<RankOutputs>& a, std::vector<RankOutputs> b,
                                    const std::string& what) {
  for (size_t r = 0; r < a.size() && r < b.size(); ++r) b[r].dx = a[r].dx;
  expect_same_bits(a, b, what + ", dx aside");
}

}  // namespace caracal::layer_test
