#pragma once
// One rank's expert weights for caracal bench, the routed experts' and the shared expert's (when
// there is one): bf16, uniform in +-sqrt(3/K) for a GEMM over K (outputs of the inputs' scale), and
// their fp32 gradient buffers. The layer and the NCCL baseline run their GEMMs on such weights.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "caracal/comm/cuda_memory.hpp"
#include "caracal/layer_config.hpp"
#include "caracal/moe_layer.hpp"

namespace caracal::bench_tool {

struct ExpertWeights {
  comm::DeviceMemory<__nv_bfloat16> w_gate_up, w_down, shared_w_gate_up, shared_w_down;
  comm::DeviceMemory<float> d_w_gate_up, d_w_down, d_shared_w_gate_up, d_shared_w_down;

  MoEWeights weights() const;  // the shared expert's pointers are null without one
};

// The weights of config.local_experts() experts (and the shared expert), filled on `stream` (not
// synchronized) from seeds seed + 1 .. seed + 4; the gradient buffers are left unwritten.
ExpertWeights make_expert_weights(const LayerConfig& config, uint64_t seed, cudaStream_t stream);

}  // namespace caracal::bench_tool
