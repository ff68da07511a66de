// The fused path: each pass over a ring of ring_rows rows, walked in macrobatches.
// forward:  zero the counters | build_schedule (and the gates) | one launch: the shared expert,
//           dispatch, the routed experts and combine's push of every macrobatch but the last |
//           (shared rows scaled) | combine_after_fused_forward (macrobatch 0's rows, left in the ring)
// backward: (replay: stage inputs | shared up/gate | build_schedule) | (dy staged) | per macrobatch,
//           ascending: (but macrobatch 0 after its forward: dispatch of its x rows | routed up/gate)
//           | reverse_combine of its padding rows | one launch: the others' dy (and, for macrobatch
//           0 after its forward, x) pulled, this GPU's rows copied by idle warps, the dgrad+SwiGLU
//           and dx tiles (macrobatch 0's with the shared expert's first), at W > 1 the dx rows of
//           other ranks' tokens summed per (token, rank) before they go home | weight gradients |
//           shared expert's weight gradients | reverse_dispatch_filled_dx_slots (in a world of one
//           rank: the last macrobatch's weight gradients after the shared expert's, the reverse
//           dispatch's sums on their idle warps)
// Cross-rank ordering comes only from the exchange launches' world barriers.
#include <algorithm>

#include "caracal/gemm/expert_pass.hpp"
#include "fused/fused_backward.hpp"
#include "fused/fused_forward.hpp"
#include "fused/weight_grads_dx_sums.hpp"
#include "layer/layer_plan.hpp"

namespace caracal::layer {

namespace {

class FusedPlan final : public LayerPlan {
 public:
  FusedPlan(LayerState& state, comm::World& world, int comm_ctas)
      : state_(state), world_(world), comm_ctas_(comm_ctas) {}

  void forward(const std::vector<MoEForwardArgs>& ranks, cudaStream_t stream) override {
    fused::FusedForwardArgs args;
    args.exchange = state_.exchange.get();
    args.router = state_.config.router;
    args.comm_ctas = comm_ctas_;
    args.pull_all_rows = state_.experiments.pull_all_rows;
    for (size_t l = 0; l < ranks.size(); ++l) {
      const MoEWeights& w = ranks[l].weights;
      const RankState& rank = state_.ranks[l];
      args.ranks.push_back({rank.routed, routed_weights(w), state_.sizes.has_shared, rank.shared,
                            {w.shared_w_gate_up, w.shared_w_down}, rank.local.buffers().ready_counters});
    }
    fused::zero_ready_counters(args, stream);
    state_.exchange->build_schedule(state_.config.router, stream);
    fused::fused_forward(world_, args, stream);  // right after the schedule: it starts early
  }

  void combine(const std::vector<__nv_bfloat16*>& y, cudaStream_t stream) override {
    // The fused kernel pushed the sums of the macrobatches before the last; macrobatch 0's wait in
    // expert_dy's ring rows.
    state_.exchange->combine_after_fused_forward(state_.config.router, state_.sizes.ring_rows, stream, y);
  }

  void replay(const std::vector<MoEForwardArgs>& ranks, cudaStream_t stream) override {
    replay_schedule(state_, ranks, stream);  // the routed rows come back macrobatch by macrobatch
  }

  void backward(const std::vector<MoEBackwardArgs>& ranks, const std::vector<MoEForwardArgs>& forward,
                bool replayed, cudaStream_t stream) override {
    const LayerSizes& sizes = state_.sizes;
    // From the first macrobatch up (the forward left macrobatch 0 in the ring; the others, and all
    // after a replay, get their up/gate tiles again). The host never learns the rows, so it walks
    // every macrobatch the schedule can have; those past its rows launch no work.
    const int windows = (sizes.routed_rows + sizes.ring_rows - 1) / sizes.ring_rows;
    // In a world of one rank the reverse dispatch's sums ride on the last macrobatch's weight
    // gradients, which then wait for the shared expert's weight gradients below.
    const bool dx_sums_ride = fused::rides_dx_sums(world_, dx_slots());
    for (int window = 0; window < windows; ++window) {
      const bool weight_grads = !dx_sums_ride || window + 1 < windows;
      routed_backward(ranks, forward, window, replayed || window > 0, weight_grads, stream);
    }
    for (size_t l = 0; l < ranks.size() && sizes.has_shared; ++l) {  // their dx already in the slots
      const MoEBackwardArgs& a = ranks[l];
      gemm::expert_weight_grads(state_.ranks[l].shared, shared_gradients(a), stream);
      copy_shared_scale_grad(state_, l, a, stream);
    }
    if (dx_sums_ride) {
      const size_t l = 0;  // a world of one rank
      fused::weight_grads_with_dx_sums(world_, *state_.exchange, state_.config.router, window_pass(l, windows - 1),
                                       window_gradients(ranks[l], forward[l].weights, l, windows - 1), stream);
    } else {
      state_.exchange->reverse_dispatch_filled_dx_slots(state_.config.router, stream, dx_slots());
    }
  }

  int ring_rows() const override { return state_.sizes.ring_rows; }
  transfer::DxSlots dx_slots() const override {
    return fused::groups_dx_rows(*state_.exchange) ? transfer::DxSlots::kPerTokenRank : transfer::DxSlots::kPerRoute;
  }

 private:
  // The schedule rows [first_row, end_row) of macrobatch `window` (in ring rows [0, end_row - first_row)).
  struct WindowRows {
    int first_row, end_row;
  };
  WindowRows window_rows(int window) const {
    const int first_row = window * state_.sizes.ring_rows;
    return {first_row, std::min(first_row + state_.sizes.ring_rows, state_.sizes.routed_rows)};
  }
  // Local rank l's routed pass over those rows.
  gemm::ExpertPass window_pass(size_t l, int window) const {
    gemm::ExpertPass pass = state_.ranks[l].routed;
    const WindowRows rows = window_rows(window);
    pass.rows.first_row = rows.first_row;
    pass.rows.end_row = rows.end_row;
    return pass;
  }
  // Where its weight gradients go: bf16 ones keep the sums of an expert cut by the window's edges in
  // fp32, the partial buffers taking turns window by window.
  gemm::ExpertPassGradients window_gradients(const MoEBackwardArgs& a, const MoEWeights& forward_weights, size_t l,
                                             int window) const {
    const LocalBuffers& local = state_.ranks[l].local.buffers();
    gemm::ExpertPassGradients grads = routed_gradients(a, forward_weights);
    grads.partial_in = window > 0 ? local.weight_grad_partials[(window + 1) % 2] : nullptr;
    grads.partial_out = local.weight_grad_partials[window % 2];
    return grads;
  }

  // Macrobatch `window`'s routed backward, its dx rows stored home (`recompute_up_gate`: its rows
  // are not the ones the forward left in the ring); its weight gradients only with `weight_grads`.
  // Macrobatch 0's launch also runs the shared expert's dgrad and dx tiles.
  void routed_backward(const std::vector<MoEBackwardArgs>& ranks, const std::vector<MoEForwardArgs>& forward,
                       int window, bool recompute_up_gate, bool weight_grads, cudaStream_t stream) {
    const auto [first_row, end_row] = window_rows(window);
    const bool pull_all_rows = state_.experiments.pull_all_rows;
    if (recompute_up_gate) {
      // The ring's x rows of the window, for the up/gate replay and the weight gradients. The
      // pass's first pull has the world barrier after every rank staged dy; the others need none
      // (they write this rank's ring only, and the reverse dispatch's barrier ends the pass).
      transfer::PullRange x_rows{first_row, end_row};
      x_rows.after_barrier = window > 0;
      state_.exchange->dispatch(stream, x_rows);
      for (size_t l = 0; l < ranks.size(); ++l) {
        const MoEWeights& w = forward[l].weights;
        gemm::expert_up_gate(window_pass(l, window), routed_weights(w), stream);
      }
    }
    // The launch pulls the other GPUs' dy rows (and, after the forward, macrobatch 0's x rows: the
    // forward's pull left those of other GPUs in the ring, so only the rows it read in place are
    // copied and no row crosses NVLink again); the idle warps copy this GPU's. The reverse combine
    // before it leaves every real row to the launch and fills the padding rows.
    transfer::PullRange dy_rows{first_row, end_row};
    dy_rows.in_place = transfer::RowsInPlace::kAll;
    dy_rows.after_barrier = recompute_up_gate;
    state_.exchange->reverse_combine(stream, dy_rows);
    fused::FusedBackwardArgs launch;
    launch.exchange = state_.exchange.get();
    launch.comm_ctas = comm_ctas_;
    launch.pull_x = !recompute_up_gate;
    launch.x_in_place = recompute_up_gate ? transfer::RowsInPlace::kNone
                        : pull_all_rows   ? transfer::RowsInPlace::kAll
                                          : transfer::RowsInPlace::kOtherGpus;
    launch.pull_all_rows = pull_all_rows;
    for (size_t l = 0; l < ranks.size(); ++l) {
      const MoEWeights& w = forward[l].weights;
      fused::FusedBackwardRank rank;
      rank.pass = window_pass(l, window);
      rank.weights = routed_weights(w);
      rank.ready_counters = state_.ranks[l].local.buffers().ready_counters;
      rank.has_shared = state_.sizes.has_shared && window == 0;
      rank.shared = state_.ranks[l].shared;
      rank.shared_weights = {w.shared_w_gate_up, w.shared_w_down};
      // Its dx straight into the exchange's slot, a row per token (not in place over its x rows).
      rank.shared.dx = state_.ranks[l].shared_dx_slot;
      rank.shared_dx_rows = state_.sizes.tokens;
      launch.ranks.push_back(rank);
    }
    fused::fused_backward(world_, launch, stream);
    for (size_t l = 0; l < ranks.size() && weight_grads; ++l) {
      gemm::expert_weight_grads(window_pass(l, window), window_gradients(ranks[l], forward[l].weights, l, window),
                                stream);
    }
  }

  LayerState& state_;
  comm::World& world_;
  int comm_ctas_;
};

}  // namespace

std::unique_ptr<LayerPlan> make_fused_plan(LayerState& state, comm::World& world, int comm_ctas) {
  return std::make_unique<FusedPlan>(state, world, comm_ctas);
}

}  // namespace caracal::layer
