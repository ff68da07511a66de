#pragma once
// An FP8 layer's weights quantized (MoEWeights::w_fp8, and the rank's own block where none is
// given): the routed experts' block (gemm::fp8_expert_weight_bytes), then, with a shared expert,
// its own (one expert of Is), each 256-byte aligned; e4m3 with 128 x 128 block scales in both
// orientations (gemm::quantize_expert_weights).
#include <cuda_runtime.h>

#include <cstddef>

#include "caracal/gemm/expert_pass_fp8.hpp"
#include "caracal/moe_layer.hpp"
#include "layer/layer_sizes.hpp"

namespace caracal::layer {

struct Fp8LayerWeightBuffers {
  gemm::Fp8ExpertWeightBuffers routed;
  gemm::Fp8ExpertWeightBuffers shared;  // null without a shared expert
};

size_t fp8_layer_weight_bytes(const LayerSizes& s);
// The buffers carved from `block` (256-byte aligned, fp8_layer_weight_bytes(s) bytes).
Fp8LayerWeightBuffers fp8_layer_weight_buffers(void* block, const LayerSizes& s);
// `weights`' routed experts (interleaved W_gate_up) and shared expert into `out`, on `stream`.
void quantize_layer_weights(const MoEWeights& weights, const LayerSizes& s, const Fp8LayerWeightBuffers& out,
                            cudaStream_t stream);

}  // namespace caracal::layer
