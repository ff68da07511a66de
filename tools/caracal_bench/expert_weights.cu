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

ExpertWeights make_expert_weights(const LayerConfig& config, uint64_t seed, cudaStream_t stream) {
  using bf16 = __nv_bfloat16;
  const size_t D = size_t(config.shape.hidden), I = size_t(config.shape.intermediate),
               L = size_t(config.local_experts()), Is = size_t(config.shape.shared_intermediate);
  const float wd = float(std::sqrt(3.0 / double(D))), wi = float(std::sqrt(3.0 / double(I)));
  ExpertWeights m;
  m.w_gate_up = comm::device_alloc<bf16>(L * 2 * I * D, "cudaMalloc(w_gate_up)");
  m.w_down = comm::device_alloc<bf16>(L * D * I, "cudaMalloc(w_down)");
  m.d_w_gate_up = comm::device_alloc<float>(L * 2 * I * D, "cudaMalloc(d_w_gate_up)");
  m.d_w_down = comm::device_alloc<float>(L * D * I, "cudaMalloc(d_w_down)");
  bench::fill_uniform(m.w_gate_up.get(), L * 2 * I * D, seed + 1, -wd, wd, stream);
  bench::fill_uniform(m.w_down.get(), L * D * I, seed + 2, -wi, wi, stream);
  if (config.shape.num_shared_experts > 0) {
    const float ws = float(std::sqrt(3.0 / double(Is)));
    m.shared_w_gate_up = comm::device_alloc<bf16>(2 * Is * D, "cudaMalloc(shared_w_gate_up)");
    m.shared_w_down = comm::device_alloc<bf16>(D * Is, "cudaMalloc(shared_w_down)");
    m.d_shared_w_gate_up = comm::device_alloc<float>(2 * Is * D, "cudaMalloc(d_shared_w_gate_up)");
    m.d_shared_w_down = comm::device_alloc<float>(D * Is, "cudaMalloc(d_shared_w_down)");
    bench::fill_uniform(m.shared_w_gate_up.get(), 2 * Is * D, seed + 3, -wd, wd, stream);
    bench::fill_uniform(m.shared_w_down.get(), D * Is, seed + 4, -ws, ws, stream);
  }
  return m;
}

}  // namespace caracal::bench_tool
