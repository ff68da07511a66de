// An FP8 layer (LayerSizes::fp8): v1's separate launches with the routed and the shared experts in
// DeepSeek-V3's FP8 recipe (gemm::Fp8ExpertPass; the recipe runs every FFN GEMM in FP8). The forward
// quantizes x at home (1 x 128 blocks along D) and pulls the e4m3 rows with their scales
// (TokenExchange::dispatch_fp8: half the bytes of bf16 rows), in the FP8 GEMMs' layout over the
// shared rows, so the shared expert reads those codes too. With FP8 weight gradients the backward
// quantizes dy at home and pulls it likewise (reverse_combine_fp8), and x's and dy's columns are
// quantized from their e4m3 rows (DeepSeek-V3's requantization); the bf16 ones
// (MoELayerOptions::fp8_weight_gradients false) read x's and dy's bf16 rows, which it pulls. A
// replayed forward pulls the rows in bf16 and quantizes them on the expert side: the same codes.
// forward:  weights quantized | x quantized at home | shared expert | build_schedule (and the gates) |
//           dispatch_fp8 (not in a world of one rank: the routed up/gate then reads the home codes
//           through the schedule's routes, and so do x's columns in the backward after it) | the
//           routed experts' FP8 pass | (shared rows scaled) | combine
// backward: (replay: stage inputs | weights quantized | x quantized at home | shared up/gate |
//           build_schedule | dispatch | routed up/gate, x quantized on the expert side) | (dy
//           staged) | FP8 weight gradients: dy quantized at home, reverse_combine_fp8; bf16:
//           reverse_combine, (not replayed) dispatch | weights quantized | the routed experts' FP8
//           backward (dx into
//           expert_dx) | the shared expert's | reverse_dispatch
// Weights given quantized (MoEWeights::w_fp8, layer/fp8_weights.hpp) are read as they are; the
// others are quantized at every forward, replay and backward (a layer's engine may have run another
// layer's weights in between).
#include "caracal/error.hpp"
#include "caracal/gemm/expert_pass_fp8.hpp"
#include "fused/fused_backward.hpp"
#include "fused/fused_forward.hpp"
#include "layer/fp8_weights.hpp"
#include "layer/layer_plan.hpp"
#include "quant/quantize_fp8.hpp"

namespace caracal::layer {

namespace {

class Fp8LaunchesPlan final : public LayerPlan {
 public:
  Fp8LaunchesPlan(LayerState& state, comm::World& world) : state_(state), world_(world) {}

  void forward(const std::vector<MoEForwardArgs>& ranks, cudaStream_t stream) override {
    check_layouts(ranks);
    const std::vector<Fp8Weights> weights = quantized_weights(ranks, stream);
    for (size_t l = 0; l < ranks.size(); ++l) quantize_home_x(l, stream);
    if (state_.experiments.fused_fp8_forward) {
      fused_forward(weights, stream);
      return;
    }
    for (size_t l = 0; l < ranks.size() && state_.sizes.has_shared; ++l) {
      gemm::expert_forward(state_.ranks[l].shared_fp8, weights[l].shared, stream, gemm::Fp8XRows::kGiven);
    }
    state_.exchange->build_schedule(state_.config.router, stream);
    if (!reads_x_in_place()) state_.exchange->dispatch_fp8(stream);
    for (size_t l = 0; l < ranks.size(); ++l) {
      gemm::expert_forward(routed_pass(l, /*replayed=*/false), weights[l].routed, stream, gemm::Fp8XRows::kGiven);
    }
  }

  void combine(const std::vector<__nv_bfloat16*>& y, cudaStream_t stream) override {
    if (state_.experiments.fused_fp8_forward) {  // the routed rows wait in expert_dy
      state_.exchange->combine_after_fused_forward(state_.config.router, 0, stream, y);
    } else {
      state_.exchange->combine(state_.config.router, stream, 0, y);
    }
  }

  void replay(const std::vector<MoEForwardArgs>& ranks, cudaStream_t stream) override {
    check_layouts(ranks);
    stage_inputs(state_, ranks, stream);
    const std::vector<Fp8Weights> weights = quantized_weights(ranks, stream);
    for (size_t l = 0; l < ranks.size() && state_.sizes.has_shared; ++l) {
      quantize_home_x(l, stream);
      gemm::expert_up_gate(state_.ranks[l].shared_fp8, weights[l].shared, stream, gemm::Fp8XRows::kGiven);
    }
    state_.exchange->build_schedule(state_.config.router, stream);
    state_.exchange->dispatch(stream);
    for (size_t l = 0; l < ranks.size(); ++l) {
      gemm::expert_up_gate(state_.ranks[l].routed_fp8, weights[l].routed, stream);
    }
  }

  void backward(const std::vector<MoEBackwardArgs>& ranks, const std::vector<MoEForwardArgs>& forward,
                bool replayed, cudaStream_t stream) override {
    check_layouts(forward);
    const bool fp8_weight_grads = state_.sizes.fp8_weight_grads;
    if (fp8_weight_grads) {  // dy quantized at home and pulled in e4m3 with g
      for (size_t l = 0; l < ranks.size(); ++l) {
        const RankState& rank = state_.ranks[l];
        quantize_home_rows(rank.io.dy, state_.sizes.tokens, rank.home_dy_fp8, stream);
      }
      state_.exchange->reverse_combine_fp8(stream);
    } else {
      state_.exchange->reverse_combine(stream, transfer::PullRange{0, 0});
    }
    // The bf16 weight-gradient GEMMs read x's bf16 rows (a replay pulled them). After
    // reverse_combine's barrier, which followed every rank's staging of x: no barrier of its own.
    if (!fp8_weight_grads && !replayed) {
      state_.exchange->dispatch(stream, transfer::PullRange{0, 0, transfer::RowsInPlace::kNone, true});
    }
    const std::vector<Fp8Weights> weights = quantized_weights(forward, stream);
    if (state_.experiments.fused_fp8_backward) {  // FP8 weight gradients (MoELayer's constructor)
      fused_backward(ranks, forward, replayed, weights, stream);
      return;
    }
    for (size_t l = 0; l < ranks.size(); ++l) {
      // FP8 weight gradients quantize x's and dy's columns from their e4m3 rows (DeepSeek-V3's
      // requantization), dy's as pulled.
      const gemm::Fp8ExpertPass pass = fp8_weight_grads ? routed_backward_pass(l, replayed) : routed_pass(l, replayed);
      gemm::expert_backward(pass, weights[l].routed, routed_gradients(ranks[l], forward[l].weights), stream);
    }
    for (size_t l = 0; l < ranks.size() && state_.sizes.has_shared; ++l) {
      const MoEBackwardArgs& a = ranks[l];
      const RankState& rank = state_.ranks[l];
      gemm::expert_backward(rank.shared_fp8, weights[l].shared, shared_gradients(a), stream);
      copy_unless_same(rank.shared_dx_slot, rank.shared_fp8.dx, int64_t(state_.sizes.tokens) * state_.sizes.hidden,
                       stream, "MoELayer::backward: cudaMemcpyAsync(shared dx)");
      copy_shared_scale_grad(state_, l, a, stream);
    }
    state_.exchange->reverse_dispatch(state_.config.router, stream);
  }

  int ring_rows() const override { return 0; }
  transfer::DxSlots dx_slots() const override { return transfer::DxSlots::kPerRoute; }

 private:
  // In a world of one rank the routed up/gate reads x's home codes in place of dispatched rows.
  bool reads_x_in_place() const { return state_.config.ep_size == 1; }
  // Local rank l's routed pass: with x read in place (not after a replay, which dispatches and
  // quantizes x's rows on the expert side), the tokens' home codes through the schedule's routes.
  gemm::Fp8ExpertPass routed_pass(size_t l, bool replayed) const {
    gemm::Fp8ExpertPass pass = state_.ranks[l].routed_fp8;
    if (reads_x_in_place() && !replayed) {
      const RankState& rank = state_.ranks[l];
      pass.x_tokens = {rank.home_x_fp8.codes, rank.home_x_fp8.scales, int64_t(state_.sizes.shared_rows)};
      pass.top_k = state_.sizes.top_k;
    }
    return pass;
  }

  // Its backward with FP8 weight gradients: dy pulled in e4m3 (reverse_combine_fp8), x's and dy's
  // columns quantized from their e4m3 rows.
  gemm::Fp8ExpertPass routed_backward_pass(size_t l, bool replayed) const {
    gemm::Fp8ExpertPass pass = routed_pass(l, replayed);
    pass.x = nullptr;
    pass.dy = nullptr;
    pass.dy_fp8 = state_.ranks[l].expert_dy_fp8;
    return pass;
  }
  // Before any launch: the FP8 GEMMs read W_gate_up interleaved.
  static void check_layouts(const std::vector<MoEForwardArgs>& ranks) {
    for (size_t l = 0; l < ranks.size(); ++l) {
      CARACAL_CHECK(ranks[l].weights.w_gate_up_layout == gemm::GateUpLayout::kInterleaved,
                    "MoELayer (fp8): rank ", l, "'s weights.w_gate_up_layout must be interleaved (the FP8 GEMMs' "
                    "order), got the [gate; up] halves");
    }
  }
  // Rank l's x at home: from the shared expert's bf16 rows where it has them (T rounded up to 128,
  // zero past T), else from the exchange's T rows.
  void quantize_home_x(size_t l, cudaStream_t stream) const {
    const LayerSizes& s = state_.sizes;
    const RankState& rank = state_.ranks[l];
    quantize_home_rows(s.has_shared ? rank.shared.x : rank.io.x, s.has_shared ? s.shared_rows : s.tokens,
                       rank.home_x_fp8, stream);
  }
  // A rank's x or dy (`count` of the rows at `rows`) into e4m3 codes and scales at home, in the FP8
  // GEMMs' layout over the exchange's home rows (T rounded up to 128): dispatch_fp8's and
  // reverse_combine_fp8's inputs, and x's the shared expert's rows.
  void quantize_home_rows(const __nv_bfloat16* rows, int count, const gemm::Fp8RowOutput& out,
                          cudaStream_t stream) const {
    const LayerSizes& s = state_.sizes;
    quant::QuantizeRowsArgs q;
    q.values = rows;
    q.rows = count;
    q.cols = s.hidden;
    q.codes = out.codes;
    q.scales = out.scales;
    q.scale_row_stride = 1;
    q.scale_block_stride = s.shared_rows;  // the exchange's home rows: T rounded up to 128
    quant::quantize_rows(q, stream);
  }
  // Each rank's routed and shared weights quantized: those the caller gave (MoEWeights::w_fp8), else
  // quantized into the rank's block (interleaved W_gate_up only: the halves layout is refused by name).
  struct Fp8Weights {
    gemm::Fp8ExpertWeights routed, shared;
  };
  std::vector<Fp8Weights> quantized_weights(const std::vector<MoEForwardArgs>& ranks, cudaStream_t stream) {
    std::vector<Fp8Weights> out;
    for (size_t l = 0; l < ranks.size(); ++l) {
      const MoEWeights& w = ranks[l].weights;
      const bool given = w.w_fp8 != nullptr;
      const Fp8LayerWeightBuffers b =
          fp8_layer_weight_buffers(given ? const_cast<void*>(w.w_fp8) : state_.ranks[l].weights_fp8, state_.sizes);
      if (!given) quantize_layer_weights(w, state_.sizes, b, stream);
      out.push_back({b.routed.operands(), b.shared.operands()});
    }
    return out;
  }

  // The experiment's forward (LayerExperiments::fused_fp8_forward): the schedule, then one launch.
  // The routed rows' outputs go to expert_dy; x's rows pulled into expert_x_codes at W > 1 (all of
  // them: the backward reads them there), read at home at W = 1 (the backward through the routes).
  void fused_forward(const std::vector<Fp8Weights>& weights, cudaStream_t stream) {
    fused::FusedForwardFp8Args args;
    args.exchange = state_.exchange.get();
    args.router = state_.config.router;
    args.pull_all_rows = state_.experiments.pull_all_rows || !reads_x_in_place();
    for (size_t l = 0; l < state_.ranks.size(); ++l) {
      const RankState& rank = state_.ranks[l];
      fused::FusedForwardFp8Rank r;
      r.pass = rank.routed_fp8;
      r.pass.out = world_.local_pointer(state_.exchange->backward_buffers().expert_dy, int(l));
      r.weights = weights[l].routed;
      r.has_shared = state_.sizes.has_shared;
      r.shared = rank.shared_fp8;
      r.shared_weights = weights[l].shared;
      r.ready_counters = rank.local.buffers().ready_counters;
      args.ranks.push_back(r);
    }
    fused::zero_ready_counters(args, stream);
    state_.exchange->build_schedule(state_.config.router, stream);
    fused::fused_forward(world_, args, stream);  // right after the schedule: it starts early
  }

  // The experiment's backward (LayerExperiments::fused_fp8_backward), after reverse_combine_fp8: the
  // shared expert's dy quantized, one launch of both experts' dgrad and dx tiles (the routed dx rows
  // into their home slots, the shared ones into its dx slot), their weight gradients, the slots summed.
  void fused_backward(const std::vector<MoEBackwardArgs>& ranks, const std::vector<MoEForwardArgs>& forward,
                      bool replayed, const std::vector<Fp8Weights>& weights, cudaStream_t stream) {
    const bool has_shared = state_.sizes.has_shared;
    fused::FusedBackwardFp8Args args;
    args.exchange = state_.exchange.get();
    for (size_t l = 0; l < ranks.size(); ++l) {
      const RankState& rank = state_.ranks[l];
      fused::FusedBackwardFp8Rank r;
      r.pass = routed_backward_pass(l, replayed);
      r.weights = weights[l].routed;
      r.ready_counters = rank.local.buffers().ready_counters;
      r.has_shared = has_shared;
      if (has_shared) {
        gemm::quantize_dy_rows(rank.shared_fp8, stream);
        r.shared = rank.shared_fp8;
        r.shared.dx = rank.shared_dx_slot;
        r.shared_weights = weights[l].shared;
        r.shared_dx_rows = state_.sizes.tokens;
      }
      args.ranks.push_back(r);
    }
    fused::fused_backward(world_, args, stream);
    for (size_t l = 0; l < ranks.size(); ++l) {
      gemm::expert_weight_grads(args.ranks[l].pass, routed_gradients(ranks[l], forward[l].weights), stream);
      if (!has_shared) continue;
      const MoEBackwardArgs& a = ranks[l];
      gemm::expert_weight_grads(state_.ranks[l].shared_fp8, shared_gradients(a), stream);
      copy_shared_scale_grad(state_, l, a, stream);
    }
    state_.exchange->reverse_dispatch_filled_dx_slots(state_.config.router, stream, transfer::DxSlots::kPerRoute);
  }

  LayerState& state_;
  comm::World& world_;
};

}  // namespace

std::unique_ptr<LayerPlan> make_fp8_launches_plan(LayerState& state, comm::World& world) {
  return std::make_unique<Fp8LaunchesPlan>(state, world);
}

}  // namespace caracal::layer
