#include "bench_validate.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <sstream>

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
  const int W = static_cast<int>(c.ep_size);
  const size_t T = static_cast<size_t>(c.tokens_per_rank), k = static_cast<size_t>(c.shape.top_k),
               D = static_cast<size_t>(c.shape.hidden), I = static_cast<size_t>(c.shape.intermediate),
               E = static_cast<size_t>(c.shape.num_experts), L = static_cast<size_t>(c.local_experts()),
               Is = static_cast<size_t>(c.shape.shared_intermediate);
  const bool shared = c.shape.num_shared_experts > 0;

  std::mt19937_64 rng(seed);
  const Bf16 gate = random_bf16(E * I * D, std::sqrt(3.0 / static_cast<double>(D)), rng);
  const Bf16 up = random_bf16(E * I * D, std::sqrt(3.0 / static_cast<double>(D)), rng);
  const Bf16 down = random_bf16(E * D * I, std::sqrt(3.0 / static_cast<double>(I)), rng);
  Bf16 shared_gate, shared_up, shared_down;
  if (shared) {
    shared_gate = random_bf16(Is * D, std::sqrt(3.0 / static_cast<double>(D)), rng);
    shared_up = random_bf16(Is * D, std::sqrt(3.0 / static_cast<double>(D)), rng);
    shared_down = random_bf16(D * Is, std::sqrt(3.0 / static_cast<double>(Is)), rng);
  }
  const Routing routing = make_routing(spec, W, c.tokens_per_rank, c.shape.top_k, c.shape.num_experts);
  std::vector<Bf16> x, dy;
  std::vector<std::vector<float>> scores;
  std::uniform_real_distribution<double> score(0.05, 1.0);
  for (int r = 0; r < W; ++r) {
    x.push_back(random_bf16(T * D, 1.0, rng));
    dy.push_back(random_bf16(T * D, 1.0, rng));
    std::vector<float> s(T * k);
    for (float& v : s) v = static_cast<float>(score(rng));
    scores.push_back(std::move(s));
  }

  MoELayer layer(c, world);
  std::vector<RankData> ranks(static_cast<size_t>(W));
  std::vector<MoEForwardArgs> fwd;
  std::vector<MoEBackwardArgs> bwd;
  for (size_t r = 0; r < ranks.size(); ++r) {
    RankData& d = ranks[r];
    Bf16 gate_up(L * 2 * I * D);
    interleave_gate_up_weights_host(gate.data() + r * L * I * D, up.data() + r * L * I * D, gate_up.data(),
                                    static_cast<int64_t>(L), static_cast<int64_t>(I), static_cast<int64_t>(D));
    d.w_gate_up = DeviceVector<uint16_t>(gate_up.size());
    d.w_gate_up.upload(gate_up.data());
    d.w_down = DeviceVector<uint16_t>(L * D * I);
    d.w_down.upload(down.data() + r * L * D * I);
    d.x = DeviceVector<uint16_t>(T * D);
    d.x.upload(x[r].data());
    d.dy = DeviceVector<uint16_t>(T * D);
    d.dy.upload(dy[r].data());
    d.y = DeviceVector<uint16_t>(T * D);
    d.dx = DeviceVector<uint16_t>(T * D);
    d.topk_idx = DeviceVector<int32_t>(T * k);
    d.topk_idx.upload(routing.rank_topk(static_cast<int64_t>(r)));
    d.scores = DeviceVector<float>(T * k);
    d.scores.upload(scores[r].data());
    d.d_scores = DeviceVector<float>(T * k);
    d.d_w_gate_up = DeviceVector<float>(L * 2 * I * D);
    d.d_w_down = DeviceVector<float>(L * D * I);
    if (shared) {
      Bf16 shared_gate_up(2 * Is * D);
      interleave_gate_up_weights_host(shared_gate.data(), shared_up.data(), shared_gate_up.data(), 1,
                                      static_cast<int64_t>(Is), static_cast<int64_t>(D));
      d.shared_w_gate_up = DeviceVector<uint16_t>(shared_gate_up.size());
      d.shared_w_gate_up.upload(shared_gate_up.data());
      d.shared_w_down = DeviceVector<uint16_t>(D * Is);
      d.shared_w_down.upload(shared_down.data());
      d.d_shared_w_gate_up = DeviceVector<float>(2 * Is * D);
      d.d_shared_w_down = DeviceVector<float>(D * Is);
    }
    MoEForwardArgs f;
    f.x = bf16_in(d.x);
    f.topk_idx = d.topk_idx.get();
    f.topk_scores = d.scores.get();
    f.weights.w_gate_up = bf16_in(d.w_gate_up);
    f.weights.w_down = bf16_in(d.w_down);
    f.weights.shared_w_gate_up = shared ? bf16_in(d.shared_w_gate_up) : nullptr;
    f.weights.shared_w_down = shared ? bf16_in(d.shared_w_down) : nullptr;
    f.y = bf16_out(d.y);
    fwd.push_back(f);
    MoEBackwardArgs b;
    b.dy = bf16_in(d.dy);
    b.dx = bf16_out(d.dx);
    b.d_topk_scores = d.d_scores.get();
    b.d_w_gate_up = d.d_w_gate_up.get();
    b.d_w_down = d.d_w_down.get();
    b.d_shared_w_gate_up = shared ? d.d_shared_w_gate_up.get() : nullptr;
    b.d_shared_w_down = shared ? d.d_shared_w_down.get() : nullptr;
    bwd.push_back(b);
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

  // The reference, rank by rank; routed weight gradients summed over the home ranks.
  ReferenceLayer ref;
  for (size_t e = 0; e < E; ++e) {
    ExpertWeights w;
    w.hidden = static_cast<int64_t>(D);
    w.intermediate = static_cast<int64_t>(I);
    const auto slice = [&](const Bf16& v, size_t n) {
      return from_bf16_bits(Bf16(v.begin() + static_cast<int64_t>(e * n), v.begin() + static_cast<int64_t>((e + 1) * n)));
    };
    w.gate = slice(gate, I * D);
    w.up = slice(up, I * D);
    w.down = slice(down, D * I);
    ref.experts.push_back(std::move(w));
  }
  if (shared) {
    ref.shared = ExpertWeights{static_cast<int64_t>(D), static_cast<int64_t>(Is), from_bf16_bits(shared_gate),
                               from_bf16_bits(shared_up), from_bf16_bits(shared_down)};
  }
  ReferenceOptions options;
  options.router = c.router;
  options.round_intermediates_to_bf16 = true;

  ValidationResult result;
  const auto record = [&](const std::string& what, double error) {
    result.errors.emplace_back(what, error);
    if (!(error <= result.tolerance) && result.passed) {
      result.passed = false;
      std::ostringstream os;
      os << what << ": relative error " << error << " > " << result.tolerance;
      result.first_failure = os.str();
    }
  };
  const auto widen_bf16 = [](uint16_t v) { return static_cast<double>(bf16_to_float(v)); };
  const auto widen_f32 = [](float v) { return static_cast<double>(v); };
  std::vector<ExpertGradients> routed(E, ExpertGradients::zeros(static_cast<int64_t>(D), static_cast<int64_t>(I)));
  for (size_t r = 0; r < ranks.size(); ++r) {
    ReferenceInputs in;
    in.tokens = static_cast<int64_t>(T);
    in.top_k = static_cast<int64_t>(k);
    in.x = from_bf16_bits(x[r]);
    const int32_t* ids = routing.rank_topk(static_cast<int64_t>(r));
    in.topk_idx.assign(ids, ids + T * k);
    in.topk_scores.assign(scores[r].begin(), scores[r].end());
    const ReferenceForwardResult f = reference_forward(ref, in, options);
    const ReferenceGradients g = reference_backward(ref, in, f, from_bf16_bits(dy[r]));
    const std::string rank = "rank " + std::to_string(r) + " ";
    record(rank + "y", relative_error(ranks[r].y.download(), f.y, widen_bf16));
    record(rank + "dx", relative_error(ranks[r].dx.download(), g.dx, widen_bf16));
    for (size_t e = 0; e < E; ++e) {
      for (size_t i = 0; i < routed[e].gate.size(); ++i) {
        routed[e].gate[i] += g.d_experts[e].gate[i];
        routed[e].up[i] += g.d_experts[e].up[i];
        routed[e].down[i] += g.d_experts[e].down[i];
      }
    }
    if (shared) {
      const std::vector<float> gu = ranks[r].d_shared_w_gate_up.download();
      std::vector<float> sg(Is * D), su(Is * D);
      deinterleave_gate_up_host(gu.data(), sg.data(), su.data(), 1, static_cast<int64_t>(Is), static_cast<int64_t>(D));
      record(rank + "d_shared_w_gate", relative_error(sg, g.d_shared->gate, widen_f32));
      record(rank + "d_shared_w_up", relative_error(su, g.d_shared->up, widen_f32));
      record(rank + "d_shared_w_down", relative_error(ranks[r].d_shared_w_down.download(), g.d_shared->down, widen_f32));
    }
  }
  // Routed weight gradients: rank r holds experts [r*L, (r+1)*L).
  for (size_t r = 0; r < ranks.size(); ++r) {
    const std::vector<float> gu = ranks[r].d_w_gate_up.download();
    const std::vector<float> dd = ranks[r].d_w_down.download();
    std::vector<float> g(L * I * D), u(L * I * D);
    deinterleave_gate_up_host(gu.data(), g.data(), u.data(), static_cast<int64_t>(L), static_cast<int64_t>(I),
                              static_cast<int64_t>(D));
    std::vector<double> want_g, want_u, want_d;
    for (size_t l = 0; l < L; ++l) {
      const ExpertGradients& w = routed[r * L + l];
      want_g.insert(want_g.end(), w.gate.begin(), w.gate.end());
      want_u.insert(want_u.end(), w.up.begin(), w.up.end());
      want_d.insert(want_d.end(), w.down.begin(), w.down.end());
    }
    const std::string rank = "rank " + std::to_string(r) + " ";
    record(rank + "d_w_gate", relative_error(g, want_g, widen_f32));
    record(rank + "d_w_up", relative_error(u, want_u, widen_f32));
    record(rank + "d_w_down", relative_error(dd, want_d, widen_f32));
  }
  return result;
}

}  // namespace caracal::bench_tool
