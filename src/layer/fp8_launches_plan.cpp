// An FP8 layer (LayerSizes::fp8): v1's separate launches with the routed experts in DeepSeek-V3's
// FP8 recipe (gemm::Fp8ExpertPass); the rows cross ranks in bf16 and are quantized on the expert
// side, the shared expert stays bf16.
// forward:  shared expert | build_schedule (and the gates) | dispatch | the routed experts' weights
//           quantized, their FP8 pass | (shared rows scaled) | combine
// backward: (replay: stage inputs | shared up/gate | build_schedule | dispatch | weights quantized,
//           routed up/gate) | (dy staged) | reverse_combine | weights quantized, the routed
//           experts' FP8 backward (dx into expert_dx) | shared expert's backward | reverse_dispatch
// Weights given quantized (MoEWeights::w_fp8) are read as they are; the others are quantized at
// every forward, replay and backward (a layer's engine may have run another layer's weights in
// between).
#include "caracal/error.hpp"
#include "caracal/gemm/expert_pass_fp8.hpp"
#include "layer/layer_plan.hpp"

namespace caracal::layer {

namespace {

class Fp8LaunchesPlan final : public LayerPlan {
 public:
  explicit Fp8LaunchesPlan(LayerState& state) : state_(state) {}

  void forward(const std::vector<MoEForwardArgs>& ranks, cudaStream_t stream) override {
    check_layouts(ranks);
    shared_forward_and_dispatch(state_, ranks, stream);
    for (size_t l = 0; l < ranks.size(); ++l) {
      gemm::expert_forward(state_.ranks[l].routed_fp8, quantized_weights(l, ranks[l].weights, stream), stream);
    }
  }

  void combine(const std::vector<__nv_bfloat16*>& y, cudaStream_t stream) override {
    state_.exchange->combine(state_.config.router, stream, 0, y);
  }

  void replay(const std::vector<MoEForwardArgs>& ranks, cudaStream_t stream) override {
    check_layouts(ranks);
    replay_schedule(state_, ranks, stream);
    state_.exchange->dispatch(stream);
    for (size_t l = 0; l < ranks.size(); ++l) {
      gemm::expert_up_gate(state_.ranks[l].routed_fp8, quantized_weights(l, ranks[l].weights, stream), stream);
    }
  }

  void backward(const std::vector<MoEBackwardArgs>& ranks, const std::vector<MoEForwardArgs>& forward,
                bool /*replayed*/, cudaStream_t stream) override {
    check_layouts(forward);
    state_.exchange->reverse_combine(stream, transfer::PullRange{0, 0});
    for (size_t l = 0; l < ranks.size(); ++l) {
      gemm::expert_backward(state_.ranks[l].routed_fp8, quantized_weights(l, forward[l].weights, stream),
                            routed_gradients(ranks[l], forward[l].weights), stream);
    }
    for (size_t l = 0; l < ranks.size() && state_.sizes.has_shared; ++l) {
      shared_backward(state_, l, ranks[l], forward[l].weights, stream);
      copy_shared_scale_grad(state_, l, ranks[l], stream);
    }
    state_.exchange->reverse_dispatch(state_.config.router, stream);
  }

  int ring_rows() const override { return 0; }
  transfer::DxSlots dx_slots() const override { return transfer::DxSlots::kPerRoute; }

 private:
  // Before any launch: the FP8 GEMMs read W_gate_up interleaved.
  static void check_layouts(const std::vector<MoEForwardArgs>& ranks) {
    for (size_t l = 0; l < ranks.size(); ++l) {
      CARACAL_CHECK(ranks[l].weights.w_gate_up_layout == gemm::GateUpLayout::kInterleaved,
                    "MoELayer (fp8): rank ", l, "'s weights.w_gate_up_layout must be interleaved (the FP8 GEMMs' "
                    "order), got the [gate; up] halves");
    }
  }
  // Rank l's routed weights quantized: those the caller gave (MoEWeights::w_fp8), else quantized
  // into the rank's block (interleaved W_gate_up only: the halves layout is refused by name).
  gemm::Fp8ExpertWeights quantized_weights(size_t l, const MoEWeights& weights, cudaStream_t stream) {
    const LayerSizes& s = state_.sizes;
    if (weights.w_fp8 != nullptr) {
      return gemm::fp8_expert_weight_operands(weights.w_fp8, s.local_experts, s.hidden, s.intermediate);
    }
    const gemm::Fp8ExpertWeightBuffers own =
        gemm::fp8_expert_weight_buffers(state_.ranks[l].weights_fp8, s.local_experts, s.hidden, s.intermediate);
    gemm::quantize_expert_weights(routed_weights(weights), s.local_experts, s.hidden, s.intermediate, own, stream);
    return own.operands();
  }

  LayerState& state_;
};

}  // namespace

std::unique_ptr<LayerPlan> make_fp8_launches_plan(LayerState& state) {
  return std::make_unique<Fp8LaunchesPlan>(state);
}

}  // namespace caracal::layer
