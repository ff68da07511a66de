#include "layer/fp8_weights.hpp"

#include <cstdint>

#include "caracal/error.hpp"
#include "layer/layer_plan.hpp"

namespace caracal::layer {

namespace {

size_t routed_bytes(const LayerSizes& s) {
  return gemm::fp8_expert_weight_bytes(s.local_experts, s.hidden, s.intermediate);  // a multiple of 256
}

}  // namespace

size_t fp8_layer_weight_bytes(const LayerSizes& s) {
  return routed_bytes(s) + (s.has_shared ? gemm::fp8_expert_weight_bytes(1, s.hidden, s.shared_intermediate) : 0);
}

Fp8LayerWeightBuffers fp8_layer_weight_buffers(void* block, const LayerSizes& s) {
  Fp8LayerWeightBuffers b;
  b.routed = gemm::fp8_expert_weight_buffers(block, s.local_experts, s.hidden, s.intermediate);
  if (s.has_shared) {
    b.shared = gemm::fp8_expert_weight_buffers(static_cast<uint8_t*>(block) + routed_bytes(s), 1, s.hidden,
                                               s.shared_intermediate);
  }
  return b;
}

void quantize_layer_weights(const MoEWeights& weights, const LayerSizes& s, const Fp8LayerWeightBuffers& out,
                            cudaStream_t stream) {
  gemm::quantize_expert_weights(routed_weights(weights), s.local_experts, s.hidden, s.intermediate, out.routed, stream);
  if (s.has_shared) {
    gemm::quantize_expert_weights({weights.shared_w_gate_up, weights.shared_w_down}, 1, s.hidden,
                                  s.shared_intermediate, out.shared, stream);
  }
}

}  // namespace caracal::layer
