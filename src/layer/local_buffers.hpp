#pragma once
// The per-rank buffers of a MoELayer outside the symmetric heap: the experts' activations, which
// no peer reads. One device allocation per local rank, zeroed at setup; the padding rows of the
// shared expert's inputs are never written afterwards, so they stay zero as the grouped GEMMs
// require. Rows of x, dy and the activation are in the layer's row format (LayerSizes::rows, typed
// LayerRow).
#include <cuda_bf16.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "caracal/comm/cuda_memory.hpp"
#include "caracal/gemm/expert_pass_fp8.hpp"
#include "caracal/moe_layer.hpp"
#include "caracal/precision_traits.hpp"
#include "layer/layer_sizes.hpp"

namespace caracal::layer {

struct LocalBuffers {
  // Routed experts: ring_rows rows, as the exchange's expert_x / expert_dy (LayerSizes::ring_rows).
  __nv_bfloat16* gate_up = nullptr;    // [ring_rows][2I] interleaved, saved by forward; the
                                       // backward's d_gate_up over it (gemm::expert_backward)
  LayerRow* activation = nullptr;      // [ring_rows][I]: the SwiGLU activation (forward), then
                                       // bf16(g * activation) (backward; the forward's is not needed there)
  float* workspace = nullptr;          // gemm::down_dgrad_workspace_floats(routed_rows, I): per schedule row
  // With LayerSizes::weight_grad_partials: bf16 weight gradients' fp32 sums between two
  // macrobatches, gemm::weight_grad_partial_floats(D, I) each, used in turn (gemm::WeightGradArgs).
  float* weight_grad_partials[2] = {nullptr, nullptr};
  // The fused kernels' counters and task slots: the forward's (fused::ready_counter_words(routed_rows,
  // shared_rows); FP8: fused::fp8_ready_counter_words(routed_rows, shared_rows, D, I), its task table
  // too) or the backward's (fused::backward_ready_counter_words(ring_rows, shared_rows); FP8 also
  // fused::backward_fp8_ready_counter_words(routed_rows, shared_rows)), whichever is more (the passes
  // take turns).
  uint32_t* ready_counters = nullptr;
  // The row-tile GEMMs' tile queue (gemm::kTileQueueWords words): the routed and the shared
  // experts' GEMMs take turns on the layer's one stream, so they share it.
  uint32_t* tile_queue = nullptr;

  // FP8 layers (LayerSizes::fp8): the routed rows in e4m3 with their 1 x 128 scales (codes
  // [routed_rows][K], scales [K / 128][routed_rows]: gemm::Fp8ExpertPass; x's are the exchange's
  // expert_x_codes and expert_x_scales), and the local experts' weights quantized
  // (gemm::fp8_expert_weight_sizes).
  gemm::Fp8RowOutput activation_fp8, dy_fp8, d_gate_up_fp8;
  uint8_t* weights_fp8 = nullptr;  // layer::fp8_layer_weight_bytes: where the weights are quantized

  // Shared expert: one "expert" over the rank's T tokens, padded to shared_rows (null without one;
  // x, out and dy also null where LayerSizes::shared_rows_in_place, the exchange's buffers serving).
  int32_t* shared_offset = nullptr;           // [2] {0, shared_rows}
  int32_t* shared_count = nullptr;            // [1] {T}
  LayerRow* shared_x = nullptr;               // [shared_rows][D]; the backward's dx over it
  __nv_bfloat16* shared_gate_up = nullptr;    // [shared_rows][2Is], saved by forward; d_gate_up over it
  LayerRow* shared_activation = nullptr;      // [shared_rows][Is], like `activation`
  __nv_bfloat16* shared_out = nullptr;        // [shared_rows][D] E_shared(x), unscaled
  LayerRow* shared_dy = nullptr;              // [shared_rows][D]
  float* shared_gates = nullptr;              // [shared_rows] c_t (1 without a scale); 0 on padding
  float* shared_dg = nullptr;                 // [shared_rows] <dy_t, E_shared(x_t)>
  float* shared_workspace = nullptr;          // (gemm::fp8_)down_dgrad_workspace_floats(shared_rows, Is)
  // FP8 layers: the shared expert's rows in e4m3 (as the routed experts', over shared_rows rows; its
  // x rows are the exchange's x_codes, shared_x_fp8 holds their columns for the weight gradients).
  gemm::Fp8RowOutput shared_x_fp8, shared_activation_fp8, shared_dy_fp8, shared_d_gate_up_fp8;
};

// Bytes of one local rank's allocation.
size_t local_bytes(const LayerSizes& sizes);

// One local rank's buffers on the current device, in one block from `allocator` (empty:
// cudaMalloc; setup: synchronizes).
class LocalMemory {
 public:
  LocalMemory(const LayerSizes& sizes, const DeviceAllocator& allocator);
  const LocalBuffers& buffers() const { return buffers_; }

 private:
  comm::DeviceBlock block_;
  LocalBuffers buffers_;
};

}  // namespace caracal::layer
