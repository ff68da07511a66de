// v1: the token exchange and the grouped GEMMs as separate launches over buffers of every row the
// schedule can have.
// forward:  shared expert | build_schedule (and the gates) | dispatch | routed experts | (shared
//           rows scaled) | combine
// backward: (replay: stage inputs | shared up/gate | build_schedule | dispatch | routed up/gate) |
//           (dy staged) | reverse_combine | routed experts' backward, the dx GEMM storing the rows
//           home | shared expert's backward | reverse_dispatch_filled_dx_slots
// Cross-rank ordering comes only from the exchange launches' world barriers.
#include "caracal/gemm/expert_pass.hpp"
#include "gemm/gate_up_dgrad_to_home.hpp"
#include "layer/layer_plan.hpp"

namespace caracal::layer {

namespace {

class SeparateLaunchesPlan final : public LayerPlan {
 public:
  SeparateLaunchesPlan(LayerState& state, comm::World& world) : state_(state), world_(world) {}

  void forward(const std::vector<MoEForwardArgs>& ranks, cudaStream_t stream) override {
    shared_forward_and_schedule(state_, ranks, stream);
    state_.exchange->dispatch(stream);
    for (size_t l = 0; l < ranks.size(); ++l) {
      gemm::expert_forward(state_.ranks[l].routed, routed_weights(ranks[l].weights), stream);
    }
  }

  void combine(const std::vector<__nv_bfloat16*>& y, cudaStream_t stream) override {
    state_.exchange->combine(state_.config.router, stream, 0, y);
  }

  void replay(const std::vector<MoEForwardArgs>& ranks, cudaStream_t stream) override {
    replay_schedule(state_, ranks, stream);
    state_.exchange->dispatch(stream);
    for (size_t l = 0; l < ranks.size(); ++l) {
      gemm::expert_up_gate(state_.ranks[l].routed, routed_weights(ranks[l].weights), stream);
    }
  }

  void backward(const std::vector<MoEBackwardArgs>& ranks, const std::vector<MoEForwardArgs>& forward,
                bool /*replayed*/, cudaStream_t stream) override {
    // Every row in one pass; the first pull of the pass, after the world barrier of the staged dy.
    state_.exchange->reverse_combine(stream, transfer::PullRange{0, 0});
    for (size_t l = 0; l < ranks.size(); ++l) {
      const MoEBackwardArgs& a = ranks[l];
      const gemm::ExpertPassWeights weights = routed_weights(forward[l].weights);
      const gemm::ExpertPass& pass = state_.ranks[l].routed;
      gemm::expert_backward_before_dx(pass, weights, routed_gradients(a, forward[l].weights), stream);
      // dx rows straight into their home slots (reverse dispatch's push in the GEMM's epilogue),
      // after reverse_combine's barrier; published by the reverse dispatch's.
      const gemm::HomeSlots home{world_.device_heap_table(), state_.exchange->backward_buffers().dx_slots,
                                 world_.first_local_rank() + static_cast<int>(l)};
      gemm::gate_up_dgrad_to_home(pass, weights, home, stream);
    }
    for (size_t l = 0; l < ranks.size() && state_.sizes.has_shared; ++l) {
      shared_backward(state_, l, ranks[l], forward[l].weights, stream);
      copy_shared_scale_grad(state_, l, ranks[l], stream);
    }
    state_.exchange->reverse_dispatch_filled_dx_slots(state_.config.router, stream, transfer::DxSlots::kPerRoute);
  }

  int ring_rows() const override { return 0; }
  transfer::DxSlots dx_slots() const override { return transfer::DxSlots::kPerRoute; }

 private:
  LayerState& state_;
  comm::World& world_;
};

}  // namespace

std::unique_ptr<LayerPlan> make_separate_launches_plan(LayerState& state, comm::World& world) {
  return std::make_unique<SeparateLaunchesPlan>(state, world);
}

}  // namespace caracal::layer
