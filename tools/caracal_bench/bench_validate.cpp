#include "bench_validate.hpp"

#include <cuda_runtime.h>

#include <cstddef>
#include <functional>
#include <memory>

#include "caracal/bf16.hpp"
#include "caracal/comm/cuda_check.hpp"
#include "caracal/comm/loopback_world.hpp"
#include "caracal/comm/nccl_bootstrap.hpp"
#include "caracal/comm/nccl_world.hpp"
#include "caracal/moe_layer.hpp"
#include "cuda_graph.hpp"
#include "cuda_stream.hpp"
#include "gpu_threads.hpp"
#include "layer_inputs.hpp"

namespace caracal::bench_tool {

namespace {

template <typename T>
std::vector<T> download(const T* device, size_t count) {
  std::vector<T> out(count);
  if (count > 0) {
    check_cuda(cudaMemcpy(out.data(), device, count * sizeof(T), cudaMemcpyDeviceToHost),
               "cudaMemcpy(bench validation)");
  }
  return out;
}

std::vector<uint16_t> download_bf16(const __nv_bfloat16* device, size_t count) {
  return download(reinterpret_cast<const uint16_t*>(device), count);
}

template <typename T>
void poison(T* device, size_t count, cudaStream_t stream) {
  if (device != nullptr) {
    check_cuda(cudaMemsetAsync(device, 0xFF, count * sizeof(T), stream), "cudaMemsetAsync(bench validation poison)");
  }
}

std::vector<float> widen(const std::vector<uint16_t>& bits) {
  std::vector<float> out(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) out[i] = bf16_to_float(bits[i]);
  return out;
}

// Splits interleaved gate/up [experts][2I][D] into `gate` and `up`.
template <typename T>
void split(const std::vector<T>& gate_up, size_t experts, size_t I, size_t D, std::vector<T>& gate,
           std::vector<T>& up) {
  gate.assign(experts * I * D, T{});
  up.assign(experts * I * D, T{});
  deinterleave_gate_up_host(gate_up.data(), gate.data(), up.data(), int64_t(experts), int64_t(I), int64_t(D));
}

struct Sizes {
  explicit Sizes(const LayerConfig& c)
      : T(size_t(c.tokens_per_rank)), k(size_t(c.shape.top_k)), D(size_t(c.shape.hidden)),
        I(size_t(c.shape.intermediate)), L(size_t(c.local_experts())),
        Is(c.shape.num_shared_experts > 0 ? size_t(c.shape.shared_intermediate) : 0) {}
  size_t T, k, D, I, L, Is;
};

// Every output of every local rank NaN (the weight gradients of the precision in use).
void poison_outputs(const MoELayer& layer, const LayerInputs& in, const Sizes& s, cudaStream_t stream) {
  for (size_t l = 0; l < in.backward.size(); ++l) {
    const MoELayerBuffers b = layer.buffers(int(l));
    const MoEBackwardArgs& g = in.backward[l];
    poison(b.y, s.T * s.D, stream);
    poison(b.dx, s.T * s.D, stream);
    poison(b.d_topk_scores, s.T * s.k, stream);
    poison(g.d_w_gate_up, s.L * 2 * s.I * s.D, stream);
    poison(g.d_w_down, s.L * s.D * s.I, stream);
    poison(g.d_w_gate_up_bf16, s.L * 2 * s.I * s.D, stream);
    poison(g.d_w_down_bf16, s.L * s.D * s.I, stream);
    if (s.Is == 0) continue;
    poison(g.d_shared_w_gate_up, 2 * s.Is * s.D, stream);
    poison(g.d_shared_w_down, s.D * s.Is, stream);
    poison(g.d_shared_w_gate_up_bf16, 2 * s.Is * s.D, stream);
    poison(g.d_shared_w_down_bf16, s.D * s.Is, stream);
  }
}

// Local rank l's inputs, weights and outputs.
RankStep download_rank(const MoELayer& layer, const LayerInputs& in, const Sizes& s, size_t l, bool bf16) {
  RankStep r;
  const MoELayerBuffers b = layer.buffers(int(l));
  const MoEWeights& w = in.forward[l].weights;
  const MoEBackwardArgs& g = in.backward[l];
  r.x = download_bf16(b.x, s.T * s.D);
  r.dy = download_bf16(b.dy, s.T * s.D);
  r.scores = download(b.topk_scores, s.T * s.k);
  split(download_bf16(w.w_gate_up, s.L * 2 * s.I * s.D), s.L, s.I, s.D, r.w_gate, r.w_up);
  r.w_down = download_bf16(w.w_down, s.L * s.D * s.I);
  r.y = download_bf16(b.y, s.T * s.D);
  r.dx = download_bf16(b.dx, s.T * s.D);
  r.d_scores = download(b.d_topk_scores, s.T * s.k);
  const auto gradient = [&](const float* fp32, const __nv_bfloat16* bits, size_t count) {
    return bf16 ? widen(download_bf16(bits, count)) : download(fp32, count);
  };
  split(gradient(g.d_w_gate_up, g.d_w_gate_up_bf16, s.L * 2 * s.I * s.D), s.L, s.I, s.D, r.d_w_gate, r.d_w_up);
  r.d_w_down = gradient(g.d_w_down, g.d_w_down_bf16, s.L * s.D * s.I);
  if (s.Is > 0) {
    split(download_bf16(w.shared_w_gate_up, 2 * s.Is * s.D), 1, s.Is, s.D, r.shared_gate, r.shared_up);
    r.shared_down = download_bf16(w.shared_w_down, s.D * s.Is);
    split(gradient(g.d_shared_w_gate_up, g.d_shared_w_gate_up_bf16, 2 * s.Is * s.D), 1, s.Is, s.D, r.d_shared_gate,
          r.d_shared_up);
    r.d_shared_down = gradient(g.d_shared_w_down, g.d_shared_w_down_bf16, s.D * s.Is);
  }
  return r;
}

// The step on `world`'s local ranks, into out.ranks. Collective for NCCL worlds.
void run_on(comm::World& world, const ValidationPlan& p, const ValidatedLayer& v, uint64_t seed, ValidationRun& out) {
  const LayerConfig config = validated_config(p, v);
  const Sizes s(config);
  const std::unique_ptr<MoELayer> built =
      layer::ExperimentalLayer::make(config, world, v.setup.options, v.setup.experiments);
  MoELayer& layer = *built;
  const bench::Stream stream;
  const LayerInputs in = make_inputs(layer, world, config, p.routing, seed, p.bf16_weight_grads, stream.get());
  const std::function<void(cudaStream_t)> step = [&](cudaStream_t st) {
    const MoEContext context = layer.forward(in.forward, st);
    layer.backward(in.backward, context, st);
  };
  poison_outputs(layer, in, s, stream.get());
  step(stream.get());
  if (p.graph) {
    const bench::CapturedGraph graph(stream.get(), step);
    for (int replay = 0; replay < 2; ++replay) {
      poison_outputs(layer, in, s, stream.get());
      graph.launch(stream.get());
    }
  }
  stream.sync();
  layer.check();
  if (world.first_local_rank() == 0) out.rounding = {layer.ring_rows(), v.setup.experiments.rows_per_route, layer.groups_dx_rows()};
  for (int l = 0; l < world.local_ranks(); ++l) {
    out.ranks[size_t(world.first_local_rank() + l)] = download_rank(layer, in, s, size_t(l), p.bf16_weight_grads);
  }
}

}  // namespace

ValidationRun run_validation_step(const ValidationPlan& p, const ValidatedLayer& v, uint64_t seed) {
  const int W = int(p.small.ep_size);
  const size_t heap = layer::ExperimentalLayer::memory(validated_config(p, v), v.setup.options, v.setup.experiments).heap;
  ValidationRun out;
  out.ranks.resize(size_t(W));
  if (p.backend != "nccl") {
    comm::LoopbackWorld world(W, heap, 0);
    run_on(world, p, v, seed, out);
  } else if (W == 1) {
    std::vector<comm::NcclComm> comms = comm::init_all({0});
    comm::NcclWorld world(comms[0].get(), heap);
    run_on(world, p, v, seed, out);
  } else {
    cli::on_each_gpu(W, heap, [&](comm::World& world, int) { run_on(world, p, v, seed, out); });
  }
  return out;
}

}  // namespace caracal::bench_tool
