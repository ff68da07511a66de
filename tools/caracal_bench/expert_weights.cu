#include "expert_weights.hpp"

#include <cmath>
#include <cstddef>

#include "device_random.cuh"

namespace caracal::bench_tool {

MoEWeights ExpertWeights::weights() const {
  MoEWeights w;
  w.w_gate_up = w_gate_up.get();
  w.w_down = w_down.get();
  w.shared_w_gate_up = shared_w_gate_up.get();
  w.shared_w_down = shared_w_down.get();
  return w;
}

void WeightGradients::set(MoEBackwardArgs& args, bool bf16) const {
  if (bf16) {
    args.d_w_gate_up_bf16 = w_gate_up_bf16.get();
    args.d_w_down_bf16 = w_down_bf16.get();
    args.d_shared_w_gate_up_bf16 = shared_w_gate_up_bf16.get();
    args.d_shared_w_down_bf16 = shared_w_down_bf16.get();
  } else {
    args.d_w_gate_up = w_gate_up.get();
    args.d_w_down = w_down.get();
    args.d_shared_w_gate_up = shared_w_gate_up.get();
    args.d_shared_w_down = shared_w_down.get();
  }
}

gemm::ExpertPassGradients WeightGradients::routed(bool bf16) const {
  if (bf16) return {nullptr, nullptr, w_gate_up_bf16.get(), w_down_bf16.get()};
  return {w_gate_up.get(), w_down.get()};
}

gemm::ExpertPassGradients WeightGradients::shared(bool bf16) const {
  if (bf16) return {nullptr, nullptr, shared_w_gate_up_bf16.get(), shared_w_down_bf16.get()};
  return {shared_w_gate_up.get(), shared_w_down.get()};
}

WeightGradients make_weight_gradients(const LayerConfig& config, GradientBuffers buffers) {
  using bf16 = __nv_bfloat16;
  const size_t D = size_t(config.shape.hidden), I = size_t(config.shape.intermediate),
               L = size_t(config.local_experts()), Is = size_t(config.shape.shared_intermediate);
  const bool fp32_grads = buffers != GradientBuffers::bf16, bf16_grads = buffers != GradientBuffers::fp32;
  WeightGradients g;
  if (fp32_grads) {
    g.w_gate_up = comm::device_alloc<float>(L * 2 * I * D, "cudaMalloc(d_w_gate_up)");
    g.w_down = comm::device_alloc<float>(L * D * I, "cudaMalloc(d_w_down)");
  }
  if (bf16_grads) {
    g.w_gate_up_bf16 = comm::device_alloc<bf16>(L * 2 * I * D, "cudaMalloc(d_w_gate_up_bf16)");
    g.w_down_bf16 = comm::device_alloc<bf16>(L * D * I, "cudaMalloc(d_w_down_bf16)");
  }
  if (config.shape.num_shared_experts == 0) return g;
  if (fp32_grads) {
    g.shared_w_gate_up = comm::device_alloc<float>(2 * Is * D, "cudaMalloc(d_shared_w_gate_up)");
    g.shared_w_down = comm::device_alloc<float>(D * Is, "cudaMalloc(d_shared_w_down)");
  }
  if (bf16_grads) {
    g.shared_w_gate_up_bf16 = comm::device_alloc<bf16>(2 * Is * D, "cudaMalloc(d_shared_w_gate_up_bf16)");
    g.shared_w_down_bf16 = comm::device_alloc<bf16>(D * Is, "cudaMalloc(d_shared_w_down_bf16)");
  }
  return g;
}

ExpertWeights make_expert_weights(const LayerConfig& config, uint64_t seed, GradientBuffers gradients,
                                  cudaStream_t stream) {
  using bf16 = __nv_bfloat16;
  const size_t D = size_t(config.shape.hidden), I = size_t(config.shape.intermediate),
               L = size_t(config.local_experts()), Is = size_t(config.shape.shared_intermediate);
  const float wd = float(std::sqrt(3.0 / double(D))), wi = float(std::sqrt(3.0 / double(I)));
  ExpertWeights m;
  m.w_gate_up = comm::device_alloc<bf16>(L * 2 * I * D, "cudaMalloc(w_gate_up)");
  m.w_down = comm::device_alloc<bf16>(L * D * I, "cudaMalloc(w_down)");
  bench::fill_uniform(m.w_gate_up.get(), L * 2 * I * D, seed + 1, -wd, wd, stream);
  bench::fill_uniform(m.w_down.get(), L * D * I, seed + 2, -wi, wi, stream);
  if (config.shape.num_shared_experts > 0) {
    const float ws = float(std::sqrt(3.0 / double(Is)));
    m.shared_w_gate_up = comm::device_alloc<bf16>(2 * Is * D, "cudaMalloc(shared_w_gate_up)");
    m.shared_w_down = comm::device_alloc<bf16>(D * Is, "cudaMalloc(shared_w_down)");
    bench::fill_uniform(m.shared_w_gate_up.get(), 2 * Is * D, seed + 3, -wd, wd, stream);
    bench::fill_uniform(m.shared_w_down.get(), D * Is, seed + 4, -ws, ws, stream);
  }
  m.gradients = make_weight_gradients(config, gradients);
  return m;
}

}  // namespace caracal::bench_tool
