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
#include "caracal/gemm/expert_pass_fp8.hpp"
#include "caracal/moe_layer.hpp"
#include "cuda_graph.hpp"
#include "cuda_stream.hpp"
#include "event_timer.hpp"
#include "layer_inputs.hpp"
#include "layer_options.hpp"

namespace caracal::bench_tool {

namespace {

double gib(double bytes) { return bytes / double(1ull << 30); }

// Bytes of one local rank's weights + gradients (fp32, or bf16) + the memory of a layer built with
// `setup` (+ for an FP8 layer the block of its weights quantized, which time_layer allocates).
double rank_bytes(const LayerConfig& c, const LayerSetup& setup, bool bf16_gradients) {
  const MoELayerMemory m = layer::ExperimentalLayer::memory(c, setup.options, setup.experiments);
  const double L = double(c.local_experts()), D = double(c.shape.hidden), I = double(c.shape.intermediate),
               Is = double(c.shape.shared_intermediate) * double(c.shape.num_shared_experts);
  const double weights = 3.0 * (L * I + Is) * D;
  const double quantized = c.precision == Precision::kFP8
                               ? double(gemm::fp8_expert_weight_bytes(int(c.local_experts()), int(c.shape.hidden),
                                                                      int(c.shape.intermediate)))
                               : 0.0;
  return double(m.heap) + double(m.local) + weights * (2.0 + (bf16_gradients ? 2.0 : 4.0)) + quantized;
}

// The timed layer of `a`'s command line: the fused one, or v1's.
std::unique_ptr<MoELayer> build_layer(comm::World& world, const LayerConfig& c, const BenchOptions& a,
                                      bool fused_forward) {
  const LayerSetup setup = layer_setup(a, fused_forward);
  return layer::ExperimentalLayer::make(c, world, setup.options, setup.experiments);
}

// That layer, its stream and its inputs.
struct LayerUnderTest {
  LayerUnderTest(comm::World& world, const LayerConfig& c, const Routing& routing, const BenchOptions& a,
                 bool fused_forward)
      : layer(build_layer(world, c, a, fused_forward)),
        in(make_inputs(*layer, world, c, routing, a.seed, a.bf16_weight_grads, stream.get())) {}

  const std::unique_ptr<MoELayer> layer;
  const bench::Stream stream;
  const LayerInputs in;
};

// An FP8 layer's weights quantized into a block of their own per local rank, which `forward` (the
// forward arguments, one a local rank) then names as MoEWeights::w_fp8; nothing for bf16. As in
// training, quantize() runs once a step, before the step's forward.
class Fp8WeightBlocks {
 public:
  Fp8WeightBlocks(MoELayer& layer, const LayerConfig& c, std::vector<MoEForwardArgs>& forward) : layer_(layer) {
    if (c.precision != Precision::kFP8) return;
    for (MoEForwardArgs& f : forward) {
      blocks_.push_back(comm::device_alloc<uint8_t>(layer.fp8_weight_bytes(), "bench: the FP8 weights"));
      f.weights.w_fp8 = blocks_.back().get();
    }
  }
  bool any() const { return !blocks_.empty(); }
  void quantize(const std::vector<MoEForwardArgs>& forward, cudaStream_t stream) const {
    for (size_t l = 0; l < blocks_.size(); ++l) layer_.quantize_weights(forward[l].weights, blocks_[l].get(), stream);
  }

 private:
  MoELayer& layer_;
  std::vector<comm::DeviceMemory<uint8_t>> blocks_;
};

// Warm-up runs of a rank timed in lock-step with ranks in other threads (NCCL, W > 1): enough for
// the layer's sizes (milliseconds a run) to reach the 200 ms the single-GPU timer asks for.
constexpr int kLockstepWarmupRuns = 20;

}  // namespace

std::string memory_shortfall(const LayerConfig& c, const BenchOptions& a, bool fused_forward, int local_ranks,
                             int device) {
  size_t free_bytes = 0, total_bytes = 0;
  check_cuda(cudaSetDevice(device), "cudaSetDevice");
  check_cuda(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  const double need = rank_bytes(c, layer_setup(a, fused_forward), a.bf16_weight_grads) * local_ranks;
  if (need < 0.94 * double(free_bytes)) return "";
  return "T=" + std::to_string(c.tokens_per_rank) + ", EP=" + std::to_string(c.ep_size) + " needs about " +
         std::to_string(gib(need)) + " GiB on GPU " + std::to_string(device) + " (weights, " +
         (a.bf16_weight_grads ? "bf16" : "fp32") + " gradients, " +
         (fused_forward ? "the fused layer's ring" : "v1's worst-case buffers") + ") but " +
         std::to_string(gib(double(free_bytes))) + " GiB are free";
}

LayerTimes time_layer(comm::World& world, const LayerConfig& c, const Routing& routing, const BenchOptions& a,
                      bool fused_forward) {
  const LayerUnderTest under_test(world, c, routing, a, fused_forward);
  MoELayer& layer = *under_test.layer;
  const bench::Stream& stream = under_test.stream;
  const LayerInputs& in = under_test.in;

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
  std::vector<MoEForwardArgs> forward_args = in.forward;
  const Fp8WeightBlocks w_fp8(layer, c, forward_args);
  const bool fp8 = w_fp8.any();
  const auto quantize = [&] { w_fp8.quantize(forward_args, stream.get()); };
  quantize();
  LayerTimes t;
  MoEContext context;
  const bool talk = world.first_local_rank() == 0;
  const std::string where =
      "T=" + std::to_string(c.tokens_per_rank) +
      (fp8 ? " (fp8): " : fused_forward ? " (fused forward): " : " (v1 forward): ");
  if (talk) progress(a, where + "forward");
  if (fp8) {
    if (talk) progress(a, where + "the weights quantized");
    t.quantize = median(as_timed(quantize));
  }
  t.forward = median(as_timed([&] { context = layer.forward(forward_args, stream.get()); }));
  layer.check();
  if (talk) progress(a, where + "backward");
  // Each backward after a forward of its own, untimed: a backward consumes its forward's activations
  // (it works in place), so a second one would replay the forward.
  const auto forward = [&] { context = layer.forward(forward_args, stream.get()); };
  forward();  // the forward the captured backward belongs to
  t.backward = median(as_timed([&] { layer.backward(in.backward, context, stream.get()); }), forward);
  layer.check();
  if (talk) progress(a, where + "forward+backward");
  const auto forward_backward = [&] {
    context = layer.forward(forward_args, stream.get());
    layer.backward(in.backward, context, stream.get());
  };
  t.step = median(as_timed([&] {
    if (fp8) quantize();  // once a step
    forward_backward();
  }));
  if (fp8) {
    if (talk) progress(a, where + "forward+backward, the weights quantized before");
    t.step_weights_ready = median(as_timed(forward_backward));
  }
  check_cuda(cudaStreamSynchronize(stream.get()), "cudaStreamSynchronize(bench)");
  layer.check();
  return t;
}

void profile_layer(comm::World& world, const LayerConfig& c, const Routing& routing, const BenchOptions& a,
                   bool fused_forward) {
  const LayerUnderTest u(world, c, routing, a, fused_forward);
  std::vector<MoEForwardArgs> forward_args = u.in.forward;
  const Fp8WeightBlocks w_fp8(*u.layer, c, forward_args);
  const auto step = [&] {  // time_layer's timed step
    w_fp8.quantize(forward_args, u.stream.get());
    const MoEContext context = u.layer->forward(forward_args, u.stream.get());
    u.layer->backward(u.in.backward, context, u.stream.get());
  };
  for (int i = 0; i < 2; ++i) step();  // warm: the first launches load modules and fill caches
  check_cuda(cudaStreamSynchronize(u.stream.get()), "cudaStreamSynchronize(profile warm-up)");
  check_cuda(cudaProfilerStart(), "cudaProfilerStart");
  step();
  check_cuda(cudaStreamSynchronize(u.stream.get()), "cudaStreamSynchronize(profiled step)");
  check_cuda(cudaProfilerStop(), "cudaProfilerStop");
  u.layer->check();
}

}  // namespace caracal::bench_tool
