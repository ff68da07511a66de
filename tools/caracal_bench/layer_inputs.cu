#include "layer_inputs.hpp"

#include <cstddef>

#include "caracal/comm/cuda_check.hpp"
#include "device_random.cuh"

namespace caracal::bench_tool {

namespace {

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
  w.gradients.set(g, bf16_gradients);
  return g;
}

}  // namespace

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

}  // namespace caracal::bench_tool
