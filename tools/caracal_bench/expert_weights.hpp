#pragma once
// One rank's expert weights for caracal bench and caracal soak, the routed experts' and the shared
// expert's (when there is one): bf16, uniform in +-sqrt(3/K) for a GEMM over K (outputs of the
// inputs' scale), and their gradient buffers in fp32, bf16 or both. The layer and the NCCL
// baseline run their GEMMs on such weights.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "caracal/comm/cuda_memory.hpp"
#include "caracal/gemm/expert_pass.hpp"
#include "caracal/layer_config.hpp"
#include "caracal/moe_layer.hpp"

namespace caracal::bench_tool {

// The precisions whose gradient buffers make_expert_weights allocates.
enum class GradientBuffers { fp32, bf16, both };

// One rank's weight-gradient buffers, the routed experts' and the shared expert's (null without
// one), in the precisions of a GradientBuffers (those of the other are null).
struct WeightGradients {
  comm::DeviceMemory<float> w_gate_up, w_down, shared_w_gate_up, shared_w_down;
  comm::DeviceMemory<__nv_bfloat16> w_gate_up_bf16, w_down_bf16, shared_w_gate_up_bf16, shared_w_down_bf16;

  // Points `args`' weight gradients at the buffers of one precision (those of the other stay null,
  // as the shared expert's without one).
  void set(MoEBackwardArgs& args, bool bf16) const;
  // The same for the grouped-GEMM engine's routed and shared passes.
  gemm::ExpertPassGradients routed(bool bf16) const;
  gemm::ExpertPassGradients shared(bool bf16) const;
};

// The gradient buffers of `buffers`' precisions for config.local_experts() experts (and the shared
// expert), unwritten.
WeightGradients make_weight_gradients(const LayerConfig& config, GradientBuffers buffers);

struct ExpertWeights {
  comm::DeviceMemory<__nv_bfloat16> w_gate_up, w_down, shared_w_gate_up, shared_w_down;
  WeightGradients gradients;

  MoEWeights weights() const;  // the shared expert's pointers are null without one
};

// The weights of config.local_experts() experts (and the shared expert), filled on `stream` (not
// synchronized) from seeds seed + 1 .. seed + 4; the gradient buffers of `gradients` are left
// unwritten.
ExpertWeights make_expert_weights(const LayerConfig& config, uint64_t seed, GradientBuffers gradients,
                                  cudaStream_t stream);

}  // namespace caracal::bench_tool
