// An FP8 layer (LayerSizes::fp8): v1's separate launches with the routed experts in DeepSeek-V3's
// FP8 recipe (gemm::Fp8ExpertPass). The forward quantizes x at home (1 x 128 blocks along D) and
// pulls the e4m3 rows with their scales (TokenExchange::dispatch_fp8: half the bytes of bf16 rows);
// the backward pulls the bf16 rows too, for the weight gradients' quantization down the columns (a
// replayed forward pulls them in bf16 and quantizes them on the expert side: the same codes). The
// shared expert stays bf16.
// forward:  shared expert | build_schedule (and the gates) | x quantized at home | dispatch_fp8 |
//           the routed experts' weights quantized, their FP8 pass | (shared rows scaled) | combine
// backward: (replay: stage inputs | shared up/gate | build_schedule | dispatch | weights quantized,
//           routed up/gate, x quantized on the expert side) | (dy staged) | reverse_combine |
//           (not replayed: dispatch) | weights quantized, the routed experts' FP8 backward (dx into
//           expert_dx) | shared expert's backward | reverse_dispatch
// Weights given quantized (MoEWeights::w_fp8) are read as they are; the others are quantized at
// every forward, replay and backward (a layer's engine may have run another layer's weights in
// between).
#include "caracal/error.hpp"
#include "caracal/gemm/expert_pass_fp8.hpp"
#include "layer/layer_plan.hpp"
#include "quant/quantize_fp8.hpp"

namespace caracal::layer {

namespace {

class Fp8LaunchesPlan final : public LayerPlan {
 public:
  explicit Fp8LaunchesPlan(LayerState& state) : state_(state) {}

  void forward(const std::vector<MoEForwardArgs>& ranks, cudaStream_t stream) override {
    check_layouts(ranks);
    shared_forward_and_schedule(state_, ranks, stream);
    for (size_t l = 0; l < ranks.size(); ++l) quantize_home_rows(l, stream);
    state_.exchange->dispatch_fp8(stream);
    for (size_t l = 0; l < ranks.size(); ++l) {
      gemm::expert_forward(state_.ranks[l].routed_fp8, quantized_weights(l, ranks[l].weights, stream), stream,
                           gemm::Fp8XRows::kGiven);
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
                bool replayed, cudaStream_t stream) override {
    check_layouts(forward);
    state_.exchange->reverse_combine(stream, transfer::PullRange{0, 0});
    // The bf16 rows the weight gradients quantize down their columns (a replay pulled them). After
    // reverse_combine's barrier, which followed every rank's staging of x: no barrier of its own.
    if (!replayed) state_.exchange->dispatch(stream, transfer::PullRange{0, 0, transfer::RowsInPlace::kNone, true});
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
  // Rank l's x (the exchange's) into its e4m3 codes and row-major scales at home (dispatch_fp8's input).
  void quantize_home_rows(size_t l, cudaStream_t stream) const {
    const LayerSizes& s = state_.sizes;
    const RankState& rank = state_.ranks[l];
    quant::QuantizeRowsArgs q;
    q.values = rank.io.x;
    q.rows = s.tokens;
    q.cols = s.hidden;
    q.codes = rank.home_x_fp8.codes;
    q.scales = rank.home_x_fp8.scales;
    q.scale_row_stride = s.hidden / kFp8Block;
    q.scale_block_stride = 1;
    quant::quantize_rows(q, stream);
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
