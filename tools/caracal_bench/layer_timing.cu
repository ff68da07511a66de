#include "layer_timing.hpp"

#include <cuda_profiler_api.h>

#include <algorithm>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "caracal/comm/cuda_check.hpp"
#include "caracal/error.hpp"
#include "caracal/moe_layer.hpp"
#include "cuda_graph.hpp"
#include "cuda_stream.hpp"
#include "device_random.cuh"
#include "event_timer.hpp"
#include "expert_weights.hpp"

namespace caracal::bench_tool {

namespace {

double gib(double bytes) { return bytes / double(1ull << 30); }

// Bytes of one local rank's weights + gradients (fp32, or bf16) + the memory of a layer built with
// `options`.
double rank_bytes(const LayerConfig& c, const MoELayerOptions& options, bool bf16_gradients) {
  const MoELayerMemory m = MoELayer::memory(c, options);
  const double L = double(c.local_experts()), D = double(c.shape.hidden), I = double(c.shape.intermediate),
               Is = double(c.shape.shared_intermediate) * double(c.shape.num_shared_experts);
  const double weights = 3.0 * (L * I + Is) * D;
  return double(m.heap) + double(m.local) + weights * (2.0 + (bf16_gradients ? 2.0 : 4.0));
}

// Every local rank's weights and the layer's argument structs over them.
struct LayerInputs {
  std::vector<ExpertWeights> weights;
  std::vector<MoEForwardArgs> forward;
  std::vector<MoEBackwardArgs> backward;
};

MoEForwardArgs forward_args(const MoELayerBuffers& b, const ExpertWeights& w) {
  MoEForwardArgs f;
  f.x = b.x;
  f.topk_idx = b.topk_idx;
  f.topk_scores = b.topk_scores;
  f.weights = w.weights();
  f.y = b.y;
  return f;
}

MoEBackwardArgs backward_args(const MoELayerBuffers& b, const ExpertWeights& w, bool bf16_gradients) {
  MoEBackwardArgs g;
  g.dy = b.dy;
  g.dx = b.dx;
  g.d_topk_scores = b.d_topk_scores;
  w.set_gradients(g, bf16_gradients);
  return g;
}

// Random weights and inputs for every local rank, the inputs straight into the layer's own buffers
// (the zero-copy path); waits for them.
LayerInputs make_inputs(MoELayer& layer, const comm::World& world, const LayerConfig& c, const Routing& routing,
                        uint64_t seed, bool bf16_gradients, cudaStream_t stream) {
  const size_t T = size_t(c.tokens_per_rank), k = size_t(c.shape.top_k), D = size_t(c.shape.hidden);
  LayerInputs in;
  for (int l = 0; l < world.local_ranks(); ++l) {
    const int rank = world.first_local_rank() + l;
    const uint64_t rank_seed = seed * 1000003ull + uint64_t(rank) * 64;
    in.weights.push_back(make_expert_weights(c, rank_seed,
                                             bf16_gradients ? GradientBuffers::bf16 : GradientBuffers::fp32, stream));
    const MoELayerBuffers b = layer.buffers(l);
    bench::fill_uniform(b.x, T * D, rank_seed + 5, -1.0f, 1.0f, stream);
    bench::fill_uniform(b.dy, T * D, rank_seed + 6, -1.0f, 1.0f, stream);
    bench::fill_uniform(b.topk_scores, T * k, rank_seed + 7, 0.05f, 1.0f, stream);
    check_cuda(cudaMemcpyAsync(b.topk_idx, routing.rank_topk(rank), T * k * sizeof(int32_t), cudaMemcpyHostToDevice,
                               stream),
               "cudaMemcpyAsync(topk_idx)");
    in.forward.push_back(forward_args(b, in.weights.back()));
    in.backward.push_back(backward_args(b, in.weights.back(), bf16_gradients));
  }
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize(bench inputs)");
  return in;
}

// Warm-up runs of a rank timed in lock-step with ranks in other threads (NCCL, W > 1): enough for
// the layer's sizes (milliseconds a run) to reach the 200 ms the single-GPU timer asks for.
constexpr int kLockstepWarmupRuns = 20;

}  // namespace

std::string memory_shortfall(const LayerConfig& c, const BenchOptions& a, bool fused_forward, int local_ranks,
                             int device) {
  size_t free_bytes = 0, total_bytes = 0;
  check_cuda(cudaSetDevice(device), "cudaSetDevice");
  check_cuda(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  const double need = rank_bytes(c, layer_options(a, fused_forward), a.bf16_weight_grads) * local_ranks;
  if (need < 0.94 * double(free_bytes)) return "";
  return "T=" + std::to_string(c.tokens_per_rank) + ", EP=" + std::to_string(c.ep_size) + " needs about " +
         std::to_string(gib(need)) + " GiB on GPU " + std::to_string(device) + " (weights, " +
         (a.bf16_weight_grads ? "bf16" : "fp32") + " gradients, " +
         (fused_forward ? "the fused layer's ring" : "v1's worst-case buffers") + ") but " +
         std::to_string(gib(double(free_bytes))) + " GiB are free";
}

MoELayerOptions layer_options(const BenchOptions& a, bool fused_forward) {
  MoELayerOptions options;
  options.exchange_sms = a.exchange_sms;
  options.fused_forward = fused_forward;
  options.fused_comm_ctas = a.fused_comm_ctas;
  options.fused_pull_all_rows = a.fused_pull_all_rows;
  options.fused_backward = !a.separate_backward;
  options.dx_sums_in_weight_grads = !a.separate_dx_sums;
  options.fused_backward_local_rows_in_launch = !a.local_rows_before_backward;
  options.rows_per_route = a.rows_per_route;
  options.dx_rows_per_route = a.dx_rows_per_route;
  options.ring_rows = a.ring_rows;
  return options;
}

LayerTimes time_layer(comm::World& world, const LayerConfig& c, const Routing& routing, const BenchOptions& a,
                      bool fused_forward) {
  MoELayer layer(c, world, layer_options(a, fused_forward));
  const bench::Stream stream;
  const LayerInputs in = make_inputs(layer, world, c, routing, a.seed, a.bf16_weight_grads, stream.get());

  // Every rank must make the same launches (they meet in world barriers), but time_runs's warm-up
  // stops when this rank's own clock passes 200 ms. With ranks in other threads, the warm-up is a
  // fixed count instead: the same on all of them.
  const bool lockstep = world.local_ranks() < world.world_size();
  const int warmup = lockstep ? std::max(a.warmup, kLockstepWarmupRuns) : a.warmup;
  const double warmup_ms = lockstep ? 0.0 : 200.0;
  const auto median = [&](const std::function<void()>& run, const std::function<void()>& prepare = {}) {
    return bench::summarize(
               bench::time_samples(stream.get(), warmup, a.reps, [&](int) { run(); }, warmup_ms, 0, prepare))
        .median_ms;
  };
  // --graph: each timed call is the replay of a CUDA graph captured once from it.
  std::vector<std::unique_ptr<bench::CapturedGraph>> graphs;
  const auto as_timed = [&](const std::function<void()>& enqueue) -> std::function<void()> {
    if (!a.graph) return enqueue;
    graphs.push_back(std::make_unique<bench::CapturedGraph>(stream.get(), [&](cudaStream_t) { enqueue(); }));
    const bench::CapturedGraph* graph = graphs.back().get();
    return [graph, &stream] { graph->launch(stream.get()); };
  };
  LayerTimes t;
  MoEContext context;
  const bool talk = world.first_local_rank() == 0;
  const std::string where =
      "T=" + std::to_string(c.tokens_per_rank) + (fused_forward ? " (fused forward): " : " (v1 forward): ");
  if (talk) progress(a, where + "forward");
  t.forward = median(as_timed([&] { context = layer.forward(in.forward, stream.get()); }));
  layer.check();
  if (talk) progress(a, where + "backward");
  // Each backward after a forward of its own, untimed: a backward consumes its forward's activations
  // (it works in place), so a second one would replay the forward.
  const auto forward = [&] { context = layer.forward(in.forward, stream.get()); };
  forward();  // the forward the captured backward belongs to
  t.backward = median(as_timed([&] { layer.backward(in.backward, context, stream.get()); }), forward);
  layer.check();
  if (talk) progress(a, where + "forward+backward");
  t.step = median(as_timed([&] {
    context = layer.forward(in.forward, stream.get());
    layer.backward(in.backward, context, stream.get());
  }));
  check_cuda(cudaStreamSynchronize(stream.get()), "cudaStreamSynchronize(bench)");
  layer.check();
  return t;
}

void profile_layer(comm::World& world, const LayerConfig& c, const Routing& routing, const BenchOptions& a,
                   bool fused_forward) {
  MoELayer layer(c, world, layer_options(a, fused_forward));
  const bench::Stream stream;
  const LayerInputs in = make_inputs(layer, world, c, routing, a.seed, a.bf16_weight_grads, stream.get());
  const auto step = [&] {
    const MoEContext context = layer.forward(in.forward, stream.get());
    layer.backward(in.backward, context, stream.get());
  };
  for (int i = 0; i < 2; ++i) step();  // warm: the first launches load modules and fill caches
  check_cuda(cudaStreamSynchronize(stream.get()), "cudaStreamSynchronize(profile warm-up)");
  check_cuda(cudaProfilerStart(), "cudaProfilerStart");
  step();
  check_cuda(cudaStreamSynchronize(stream.get()), "cudaStreamSynchronize(profiled step)");
  check_cuda(cudaProfilerStop(), "cudaProfilerStop");
  layer.check();
}

}  // namespace caracal::bench_tool
