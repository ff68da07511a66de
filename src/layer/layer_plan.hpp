#pragma once
// How a MoELayer runs its passes, chosen once at construction: v1's separate launches over buffers
// of every row, the fused launches over a ring of rows (MoELayerOptions::fused_forward), or, in
// FP8, v1's launches with the FP8 expert pass. Both
// work on the layer's LayerState; MoELayer checks the arguments, stages the inputs and dy, scales
// the shared expert's rows and copies and poisons the outputs around them. Every call enqueues on
// `stream` only.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <memory>
#include <vector>

#include "caracal/comm/world.hpp"
#include "caracal/gemm/expert_pass.hpp"
#include "caracal/moe_layer.hpp"
#include "layer/layer_state.hpp"

namespace caracal::layer {

class LayerPlan {
 public:
  virtual ~LayerPlan() = default;
  // After the inputs are staged: the shared expert, the schedule and the gates, dispatch and the
  // routed experts, up to combine's input.
  virtual void forward(const std::vector<MoEForwardArgs>& ranks, cudaStream_t stream) = 0;
  // combine: y into `y` (one per local rank), or into the exchange's y buffers where `y` is empty.
  virtual void combine(const std::vector<__nv_bfloat16*>& y, cudaStream_t stream) = 0;
  // What the backward reads of forward `ranks`, recomputed with the forward's own launches (bitwise
  // the same), when the buffers no longer hold that forward's activations.
  virtual void replay(const std::vector<MoEForwardArgs>& ranks, cudaStream_t stream) = 0;
  // After dy is staged: the routed and shared experts' backward (`replayed`: after replay()) and
  // the reverse dispatch, every gradient in place but dx and d_topk_scores (in the exchange's buffers).
  virtual void backward(const std::vector<MoEBackwardArgs>& ranks, const std::vector<MoEForwardArgs>& forward,
                        bool replayed, cudaStream_t stream) = 0;
  // MoELayer::ring_rows(); how the backward fills the dx slots.
  virtual int ring_rows() const = 0;
  virtual transfer::DxSlots dx_slots() const = 0;
};

// A rank's routed experts' weights, and where their gradients go (in the weights' row order).
inline gemm::ExpertPassWeights routed_weights(const MoEWeights& w) {
  return {w.w_gate_up, w.w_down, w.w_gate_up_layout};
}
inline gemm::ExpertPassGradients routed_gradients(const MoEBackwardArgs& a, const MoEWeights& forward_weights) {
  gemm::ExpertPassGradients grads{a.d_w_gate_up, a.d_w_down, a.d_w_gate_up_bf16, a.d_w_down_bf16};
  grads.w_gate_up_layout = forward_weights.w_gate_up_layout;
  return grads;
}

std::unique_ptr<LayerPlan> make_separate_launches_plan(LayerState& state, comm::World& world);
// An FP8 layer's (LayerSizes::fp8): v1's launches with the routed experts' FP8 pass.
std::unique_ptr<LayerPlan> make_fp8_launches_plan(LayerState& state, comm::World& world);
// `comm_ctas`: MoELayerOptions::fused_comm_ctas, checked by the caller.
std::unique_ptr<LayerPlan> make_fused_plan(LayerState& state, comm::World& world, int comm_ctas);

}  // namespace caracal::layer
