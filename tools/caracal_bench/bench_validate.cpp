#include "bench_validate.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <sstream>
#include <type_traits>

#include "caracal/bf16.hpp"
#include "caracal/comm/cuda_check.hpp"
#include "caracal/comm/cuda_memory.hpp"
#include "caracal/error.hpp"
#include "caracal/moe_layer.hpp"
#include "caracal/reference.hpp"

namespace caracal::bench_tool {

namespace {

using Bf16 = std::vector<uint16_t>;

constexpr int64_t kSmallHidden = 256;
constexpr int64_t kSmallIntermediate = 128;
constexpr int64_t kSmallShared = 192;
constexpr int64_t kSmallTokens = 37;

Bf16 random_bf16(size_t count, double bound, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> value(-bound, bound);
  Bf16 out(count);
  for (uint16_t& v : out) v = bf16_bits(static_cast<float>(value(rng)));
  return out;
}

template <typename T>
struct DeviceVector {
  comm::DeviceMemory<T> memory;
  size_t count = 0;

  explicit DeviceVector(size_t n = 0) : count(n) {
    if (n > 0) {
      memory = comm::device_alloc<T>(n, "cudaMalloc(bench validation)");
      check_cuda(cudaMemset(memory.get(), 0xFF, n * sizeof(T)), "cudaMemset(bench validation)");  // NaN
    }
  }
  T* get() const { return memory.get(); }
  void upload(const T* values) const {
    check_cuda(cudaMemcpy(get(), values, count * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy(upload)");
  }
  std::vector<T> download() const {
    std::vector<T> out(count);
    if (count > 0) {
      check_cuda(cudaMemcpy(out.data(), get(), count * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy(download)");
    }
    return out;
  }
};

const __nv_bfloat16* bf16_in(const DeviceVector<uint16_t>& v) { return reinterpret_cast<const __nv_bfloat16*>(v.get()); }
__nv_bfloat16* bf16_out(const DeviceVector<uint16_t>& v) { return reinterpret_cast<__nv_bfloat16*>(v.get()); }

// Relative Frobenius error; NaN (an element never written) makes it infinite.
template <typename T, typename Widen>
double relative_error(const std::vector<T>& got, const std::vector<double>& want, Widen widen) {
  if (got.size() != want.size()) return INFINITY;
  double err2 = 0.0, ref2 = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = widen(got[i]);
    if (std::isnan(g)) return INFINITY;
    err2 += (g - want[i]) * (g - want[i]);
    ref2 += want[i] * want[i];
  }
  if (ref2 == 0.0) return err2 == 0.0 ? 0.0 : INFINITY;
  return std::sqrt(err2 / ref2);
}

struct RankData {
  DeviceVector<uint16_t> w_gate_up, w_down, shared_w_gate_up, shared_w_down, x, dy, y, dx;
  DeviceVector<int32_t> topk_idx;
  DeviceVector<float> scores, d_scores, d_w_gate_up, d_w_down, d_shared_w_gate_up, d_shared_w_down;
};

// The layer's sizes as host counts.
struct Sizes {
  explicit Sizes(const LayerConfig& c)
      : W(static_cast<int>(c.ep_size)), T(static_cast<size_t>(c.tokens_per_rank)),
        k(static_cast<size_t>(c.shape.top_k)), D(static_cast<size_t>(c.shape.hidden)),
        I(static_cast<size_t>(c.shape.intermediate)), E(static_cast<size_t>(c.shape.num_experts)),
        L(static_cast<size_t>(c.local_experts())), Is(static_cast<size_t>(c.shape.shared_intermediate)),
        shared(c.shape.num_shared_experts > 0) {}
  int W;
  size_t T, k, D, I, E, L, Is;
  bool shared;
};

// Every weight (all E experts, split gate and up) and every rank's inputs, as bf16 bits.
struct Inputs {
  Bf16 gate, up, down, shared_gate, shared_up, shared_down;
  Routing routing;
  std::vector<Bf16> x, dy;
  std::vector<std::vector<float>> scores;
};

Inputs make_inputs(const LayerConfig& c, const Sizes& s, const RoutingSpec& spec, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const double d_bound = std::sqrt(3.0 / static_cast<double>(s.D));
  Inputs in;
  in.gate = random_bf16(s.E * s.I * s.D, d_bound, rng);
  in.up = random_bf16(s.E * s.I * s.D, d_bound, rng);
  in.down = random_bf16(s.E * s.D * s.I, std::sqrt(3.0 / static_cast<double>(s.I)), rng);
  if (s.shared) {
    in.shared_gate = random_bf16(s.Is * s.D, d_bound, rng);
    in.shared_up = random_bf16(s.Is * s.D, d_bound, rng);
    in.shared_down = random_bf16(s.D * s.Is, std::sqrt(3.0 / static_cast<double>(s.Is)), rng);
  }
  in.routing = make_routing(spec, s.W, c.tokens_per_rank, c.shape.top_k, c.shape.num_experts);
  std::uniform_real_distribution<double> score(0.05, 1.0);
  for (int r = 0; r < s.W; ++r) {
    in.x.push_back(random_bf16(s.T * s.D, 1.0, rng));
    in.dy.push_back(random_bf16(s.T * s.D, 1.0, rng));
    std::vector<float> scores(s.T * s.k);
    for (float& v : scores) v = static_cast<float>(score(rng));
    in.scores.push_back(std::move(scores));
  }
  return in;
}

// Rank r's weights (its L experts, gate and up interleaved) and inputs on the device; outputs
// allocated (NaN until written).
void upload_rank(const Inputs& in, const Sizes& s, size_t r, RankData& d) {
  const size_t L = s.L, I = s.I, D = s.D, T = s.T, k = s.k, Is = s.Is;
  Bf16 gate_up(L * 2 * I * D);
  interleave_gate_up_weights_host(in.gate.data() + r * L * I * D, in.up.data() + r * L * I * D, gate_up.data(),
                                  static_cast<int64_t>(L), static_cast<int64_t>(I), static_cast<int64_t>(D));
  d.w_gate_up = DeviceVector<uint16_t>(gate_up.size());
  d.w_gate_up.upload(gate_up.data());
  d.w_down = DeviceVector<uint16_t>(L * D * I);
  d.w_down.upload(in.down.data() + r * L * D * I);
  d.x = DeviceVector<uint16_t>(T * D);
  d.x.upload(in.x[r].data());
  d.dy = DeviceVector<uint16_t>(T * D);
  d.dy.upload(in.dy[r].data());
  d.y = DeviceVector<uint16_t>(T * D);
  d.dx = DeviceVector<uint16_t>(T * D);
  d.topk_idx = DeviceVector<int32_t>(T * k);
  d.topk_idx.upload(in.routing.rank_topk(static_cast<int64_t>(r)));
  d.scores = DeviceVector<float>(T * k);
  d.scores.upload(in.scores[r].data());
  d.d_scores = DeviceVector<float>(T * k);
  d.d_w_gate_up = DeviceVector<float>(L * 2 * I * D);
  d.d_w_down = DeviceVector<float>(L * D * I);
  if (!s.shared) return;
  Bf16 shared_gate_up(2 * Is * D);
  interleave_gate_up_weights_host(in.shared_gate.data(), in.shared_up.data(), shared_gate_up.data(), 1,
                                  static_cast<int64_t>(Is), static_cast<int64_t>(D));
  d.shared_w_gate_up = DeviceVector<uint16_t>(shared_gate_up.size());
  d.shared_w_gate_up.upload(shared_gate_up.data());
  d.shared_w_down = DeviceVector<uint16_t>(D * Is);
  d.shared_w_down.upload(in.shared_down.data());
  d.d_shared_w_gate_up = DeviceVector<float>(2 * Is * D);
  d.d_shared_w_down = DeviceVector<float>(D * Is);
}

MoEForwardArgs forward_args(const RankData& d, bool shared) {
  MoEForwardArgs f;
  f.x = bf16_in(d.x);
  f.topk_idx = d.topk_idx.get();
  f.topk_scores = d.scores.get();
  f.weights.w_gate_up = bf16_in(d.w_gate_up);
  f.weights.w_down = bf16_in(d.w_down);
  f.weights.shared_w_gate_up = shared ? bf16_in(d.shared_w_gate_up) : nullptr;
  f.weights.shared_w_down = shared ? bf16_in(d.shared_w_down) : nullptr;
  f.y = bf16_out(d.y);
  return f;
}

MoEBackwardArgs backward_args(const RankData& d, bool shared) {
  MoEBackwardArgs b;
  b.dy = bf16_in(d.dy);
  b.dx = bf16_out(d.dx);
  b.d_topk_scores = d.d_scores.get();
  b.d_w_gate_up = d.d_w_gate_up.get();
  b.d_w_down = d.d_w_down.get();
  b.d_shared_w_gate_up = shared ? d.d_shared_w_gate_up.get() : nullptr;
  b.d_shared_w_down = shared ? d.d_shared_w_down.get() : nullptr;
  return b;
}

// One forward and one backward of `layer` over every rank, then MoELayer::check.
void run_step(MoELayer& layer, const std::vector<RankData>& ranks, bool shared) {
  std::vector<MoEForwardArgs> fwd;
  std::vector<MoEBackwardArgs> bwd;
  for (const RankData& d : ranks) {
    fwd.push_back(forward_args(d, shared));
    bwd.push_back(backward_args(d, shared));
  }
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize(bench validation uploads)");
  cudaStream_t stream = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  try {
    const MoEContext context = layer.forward(fwd, stream);
    layer.backward(bwd, context, stream);
    check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize(bench validation)");
    layer.check();
  } catch (...) {
    (void)cudaStreamDestroy(stream);
    throw;
  }
  (void)cudaStreamDestroy(stream);
}

// The fp64 reference layer of every expert (split gate and up) and the shared expert.
ReferenceLayer reference_layer(const Inputs& in, const Sizes& s) {
  ReferenceLayer ref;
  for (size_t e = 0; e < s.E; ++e) {
    ExpertWeights w;
    w.hidden = static_cast<int64_t>(s.D);
    w.intermediate = static_cast<int64_t>(s.I);
    const auto slice = [&](const Bf16& v, size_t n) {
      return from_bf16_bits(Bf16(v.begin() + static_cast<int64_t>(e * n), v.begin() + static_cast<int64_t>((e + 1) * n)));
    };
    w.gate = slice(in.gate, s.I * s.D);
    w.up = slice(in.up, s.I * s.D);
    w.down = slice(in.down, s.D * s.I);
    ref.experts.push_back(std::move(w));
  }
  if (s.shared) {
    ref.shared = ExpertWeights{static_cast<int64_t>(s.D), static_cast<int64_t>(s.Is), from_bf16_bits(in.shared_gate),
                               from_bf16_bits(in.shared_up), from_bf16_bits(in.shared_down)};
  }
  return ref;
}

// Records each comparison in `result`; the first above the tolerance fails it.
class Recorder {
 public:
  explicit Recorder(ValidationResult& result) : result_(result) {}
  template <typename T>
  void compare(const std::string& what, const std::vector<T>& got, const std::vector<double>& want) {
    const double error = relative_error(got, want, [](T v) {
      if constexpr (std::is_same_v<T, uint16_t>) {
        return static_cast<double>(bf16_to_float(v));
      } else {
        return static_cast<double>(v);
      }
    });
    result_.errors.emplace_back(what, error);
    if (!(error <= result_.tolerance) && result_.passed) {
      result_.passed = false;
      std::ostringstream os;
      os << what << ": relative error " << error << " > " << result_.tolerance;
      result_.first_failure = os.str();
    }
  }

 private:
  ValidationResult& result_;
};

// Rank r's y, dx and shared-expert gradients against the reference; its routed experts'
// gradients added into `routed` (every rank's tokens reach every expert).
void compare_rank(const ReferenceLayer& ref, const ReferenceOptions& options, const Inputs& in, const Sizes& s,
                  size_t r, const RankData& d, std::vector<ExpertGradients>& routed, Recorder& record) {
  ReferenceInputs ri;
  ri.tokens = static_cast<int64_t>(s.T);
  ri.top_k = static_cast<int64_t>(s.k);
  ri.x = from_bf16_bits(in.x[r]);
  const int32_t* ids = in.routing.rank_topk(static_cast<int64_t>(r));
  ri.topk_idx.assign(ids, ids + s.T * s.k);
  ri.topk_scores.assign(in.scores[r].begin(), in.scores[r].end());
  const ReferenceForwardResult f = reference_forward(ref, ri, options);
  const ReferenceGradients g = reference_backward(ref, ri, f, from_bf16_bits(in.dy[r]));
  const std::string rank = "rank " + std::to_string(r) + " ";
  record.compare(rank + "y", d.y.download(), f.y);
  record.compare(rank + "dx", d.dx.download(), g.dx);
  for (size_t e = 0; e < s.E; ++e) {
    for (size_t i = 0; i < routed[e].gate.size(); ++i) {
      routed[e].gate[i] += g.d_experts[e].gate[i];
      routed[e].up[i] += g.d_experts[e].up[i];
      routed[e].down[i] += g.d_experts[e].down[i];
    }
  }
  if (!s.shared) return;
  const std::vector<float> gu = d.d_shared_w_gate_up.download();
  std::vector<float> sg(s.Is * s.D), su(s.Is * s.D);
  deinterleave_gate_up_host(gu.data(), sg.data(), su.data(), 1, static_cast<int64_t>(s.Is), static_cast<int64_t>(s.D));
  record.compare(rank + "d_shared_w_gate", sg, g.d_shared->gate);
  record.compare(rank + "d_shared_w_up", su, g.d_shared->up);
  record.compare(rank + "d_shared_w_down", d.d_shared_w_down.download(), g.d_shared->down);
}

// Rank r's routed weight gradients (experts [r*L, (r+1)*L)) against the reference's sums.
void compare_routed_gradients(const Sizes& s, size_t r, const RankData& d, const std::vector<ExpertGradients>& routed,
                              Recorder& record) {
  const std::vector<float> gu = d.d_w_gate_up.download();
  std::vector<float> g(s.L * s.I * s.D), u(s.L * s.I * s.D);
  deinterleave_gate_up_host(gu.data(), g.data(), u.data(), static_cast<int64_t>(s.L), static_cast<int64_t>(s.I),
                            static_cast<int64_t>(s.D));
  std::vector<double> want_g, want_u, want_d;
  for (size_t l = 0; l < s.L; ++l) {
    const ExpertGradients& w = routed[r * s.L + l];
    want_g.insert(want_g.end(), w.gate.begin(), w.gate.end());
    want_u.insert(want_u.end(), w.up.begin(), w.up.end());
    want_d.insert(want_d.end(), w.down.begin(), w.down.end());
  }
  const std::string rank = "rank " + std::to_string(r) + " ";
  record.compare(rank + "d_w_gate", g, want_g);
  record.compare(rank + "d_w_up", u, want_u);
  record.compare(rank + "d_w_down", d.d_w_down.download(), want_d);
}

}  // namespace

LayerConfig small_config(const LayerConfig& config) {
  LayerConfig small = config;
  const int64_t W = config.ep_size;
  const int64_t L = std::min<int64_t>(config.local_experts(), 4);
  small.shape.hidden = kSmallHidden;
  small.shape.intermediate = kSmallIntermediate;
  small.shape.num_experts = W * L;
  small.shape.top_k = std::min(config.shape.top_k, W * L);
  small.shape.shared_intermediate = config.shape.num_shared_experts > 0 ? kSmallShared : 0;
  small.tokens_per_rank = kSmallTokens;
  return small;
}

RoutingSpec small_routing(const RoutingSpec& spec, const LayerConfig& small) {
  RoutingSpec out = spec;
  out.target_expert = static_cast<int32_t>(spec.target_expert % small.shape.num_experts);
  return out;
}

ValidationResult validate_layer(const LayerConfig& c, const RoutingSpec& spec, comm::World& world, uint64_t seed) {
  CARACAL_CHECK(world.local_ranks() == world.world_size(), "validation needs every rank in this process");
  const Sizes s(c);
  const Inputs in = make_inputs(c, s, spec, seed);
  MoELayer layer(c, world);
  std::vector<RankData> ranks(static_cast<size_t>(s.W));
  for (size_t r = 0; r < ranks.size(); ++r) upload_rank(in, s, r, ranks[r]);
  run_step(layer, ranks, s.shared);

  const ReferenceLayer ref = reference_layer(in, s);
  ReferenceOptions options;
  options.router = c.router;
  options.round_intermediates_to_bf16 = true;
  ValidationResult result;
  Recorder record(result);
  std::vector<ExpertGradients> routed(s.E, ExpertGradients::zeros(static_cast<int64_t>(s.D), static_cast<int64_t>(s.I)));
  for (size_t r = 0; r < ranks.size(); ++r) compare_rank(ref, options, in, s, r, ranks[r], routed, record);
  for (size_t r = 0; r < ranks.size(); ++r) compare_routed_gradients(s, r, ranks[r], routed, record);
  return result;
}

}  // namespace caracal::bench_tool
