#include "layer/layer_state.hpp"

#include "layer/shared_rows.hpp"

namespace caracal::layer {

RankState make_rank_state(const LayerSizes& sizes, const transfer::TokenExchange& exchange, const comm::World& world,
                          int l, const MoELayerOptions& options) {
  const int gemm_ctas = options.gemm_ctas;
  // The GEMMs take their row tiles in order from the rank's tile queue (their operands then stay in
  // L2), which serves at most kTileQueueMaxCtas CTAs; more take them at a fixed stride.
  const bool tile_queue = gemm_ctas <= gemm::kTileQueueMaxCtas;
  RankState state{LocalMemory(sizes, options.local_allocator), {}, {}, {}, {}, nullptr, {}, {}, nullptr, nullptr};
  const LocalBuffers& local = state.local.buffers();
  const transfer::ScheduleBuffers& schedule = exchange.schedule_buffers();
  const transfer::RouterBuffers& router = exchange.router_buffers();
  const transfer::ForwardBuffers& fwd = exchange.forward_buffers();
  const transfer::BackwardBuffers& bwd = exchange.backward_buffers();
  const auto at = [&](auto ptr) { return world.local_pointer(ptr, l); };

  state.io.x = at(fwd.x);
  state.io.topk_idx = at(schedule.topk_idx);
  state.io.topk_scores = at(router.topk_scores);
  state.io.y = at(fwd.y);
  state.io.dy = at(bwd.dy);
  state.io.dx = at(bwd.dx);
  state.io.d_topk_scores = at(router.d_topk_scores);

  // The routed experts' GEMMs read the same schedule view as the transfers.
  gemm::ExpertPass& routed = state.routed;
  routed.rows = exchange.schedule_view(l);
  routed.hidden = sizes.hidden;
  routed.intermediate = sizes.intermediate;
  routed.num_ctas = gemm_ctas;
  routed.tile_queue = tile_queue ? local.tile_queue : nullptr;
  routed.x = at(fwd.expert_x);
  routed.gate_up = local.gate_up;
  routed.activation = local.activation;
  // The fused forward's down tiles store into expert_dy's ring rows, which the backward fills
  // only later (with dy); its group sums push them home.
  routed.out = exchange.options().expert_out ? at(fwd.expert_out) : at(bwd.expert_dy);
  routed.dy = at(bwd.expert_dy);
  routed.gates = at(bwd.expert_gates);
  routed.d_gate_up = local.gate_up;  // in place (gemm::expert_backward)
  routed.dg = at(bwd.expert_dg);
  routed.workspace = local.workspace;
  routed.dx = nullptr;  // the dx rows go to their home slots (gemm::gate_up_dgrad_to_home)
  if (sizes.fp8) {
    gemm::Fp8ExpertPass& fp8 = state.routed_fp8;
    fp8.rows = routed.rows;
    fp8.hidden = routed.hidden;
    fp8.intermediate = routed.intermediate;
    fp8.num_ctas = routed.num_ctas;
    fp8.tile_queue = routed.tile_queue;
    fp8.x = routed.x;
    fp8.x_fp8 = {at(fwd.expert_x_codes), at(fwd.expert_x_scales)};  // what dispatch_fp8 fills
    fp8.gate_up = routed.gate_up;
    fp8.activation = routed.activation;
    fp8.activation_fp8 = local.activation_fp8;
    fp8.out = routed.out;
    fp8.dy = routed.dy;
    fp8.dy_fp8 = local.dy_fp8;
    fp8.gates = routed.gates;
    fp8.d_gate_up = routed.d_gate_up;  // in place over gate_up
    fp8.d_gate_up_fp8 = local.d_gate_up_fp8;
    fp8.dg = routed.dg;
    fp8.workspace = routed.workspace;
    fp8.dx = at(bwd.expert_dx);  // reverse_dispatch takes the rows home
    if (sizes.fp8_weight_grads) {  // each in the e4m3 rows of its K the backward is done with
      const auto columns = [](const gemm::Fp8RowOutput& r) { return gemm::Fp8ColumnOutput{r.codes, r.scales}; };
      fp8.x_columns = columns(fp8.x_fp8);
      fp8.dy_columns = columns(local.dy_fp8);
      fp8.d_gate_up_columns = columns(local.d_gate_up_fp8);
      fp8.activation_columns = columns(local.activation_fp8);
    }
    state.weights_fp8 = local.weights_fp8;
    state.home_x_fp8 = {at(fwd.x_codes), at(fwd.x_scales)};
  }
  if (!sizes.has_shared) return state;

  gemm::ExpertPass& shared = state.shared;
  shared.rows = ScheduleView{local.shared_offset, local.shared_count, 1, sizes.shared_rows};
  shared.hidden = sizes.hidden;
  shared.intermediate = sizes.shared_intermediate;
  shared.num_ctas = gemm_ctas;
  shared.tile_queue = routed.tile_queue;
  const bool shared_in_place = sizes.shared_rows_in_place();  // no copies (LayerSizes)
  shared.x = shared_in_place ? state.io.x : local.shared_x;
  shared.gate_up = local.shared_gate_up;
  shared.activation = local.shared_activation;
  shared.out = shared_in_place ? at(fwd.shared_out) : local.shared_out;
  shared.dy = shared_in_place ? state.io.dy : local.shared_dy;
  shared.gates = local.shared_gates;
  shared.d_gate_up = local.shared_gate_up;  // in place, as the routed experts'

  shared.dg = local.shared_dg;
  shared.workspace = local.shared_workspace;
  shared.dx = shared_in_place ? at(bwd.shared_dx) : local.shared_x;  // else in place, as the routed experts'

  state.shared_out_slot = at(fwd.shared_out);
  state.shared_dx_slot = at(bwd.shared_dx);
  if (sizes.fp8) {  // the shared expert in FP8 too (DeepSeek-V3's recipe: every FFN GEMM), on its buffers
    gemm::Fp8ExpertPass& fp8 = state.shared_fp8;
    fp8.rows = shared.rows;
    fp8.hidden = shared.hidden;
    fp8.intermediate = shared.intermediate;
    fp8.num_ctas = shared.num_ctas;
    fp8.tile_queue = shared.tile_queue;
    fp8.x = shared.x;
    fp8.x_fp8 = local.shared_x_fp8;
    fp8.gate_up = shared.gate_up;
    fp8.activation = shared.activation;
    fp8.activation_fp8 = local.shared_activation_fp8;
    fp8.out = shared.out;
    fp8.dy = shared.dy;
    fp8.dy_fp8 = local.shared_dy_fp8;
    fp8.gates = shared.gates;
    fp8.d_gate_up = shared.d_gate_up;  // in place over gate_up
    fp8.d_gate_up_fp8 = local.shared_d_gate_up_fp8;
    fp8.dg = shared.dg;
    fp8.workspace = shared.workspace;
    fp8.dx = shared.dx;
    if (sizes.fp8_weight_grads) {
      const auto columns = [](const gemm::Fp8RowOutput& r) { return gemm::Fp8ColumnOutput{r.codes, r.scales}; };
      fp8.x_columns = columns(local.shared_x_fp8);
      fp8.dy_columns = columns(local.shared_dy_fp8);
      fp8.d_gate_up_columns = columns(local.shared_d_gate_up_fp8);
      fp8.activation_columns = columns(local.shared_activation_fp8);
    }
  }
  return state;
}

void stage_inputs(LayerState& state, const std::vector<MoEForwardArgs>& args, cudaStream_t stream) {
  const LayerSizes& sizes = state.sizes;
  const int64_t rows = static_cast<int64_t>(sizes.tokens) * sizes.hidden;
  const int64_t routes = static_cast<int64_t>(sizes.tokens) * sizes.top_k;
  for (size_t l = 0; l < args.size(); ++l) {
    const MoEForwardArgs& a = args[l];
    RankState& rank = state.ranks[l];
    copy_unless_same(rank.io.x, a.x, rows, stream, "MoELayer: cudaMemcpyAsync(x)");
    copy_unless_same(rank.io.topk_idx, a.topk_idx, routes, stream, "MoELayer: cudaMemcpyAsync(topk_idx)");
    copy_unless_same(rank.io.topk_scores, a.topk_scores, routes, stream, "MoELayer: cudaMemcpyAsync(topk_scores)");
    if (!sizes.has_shared) continue;
    // The shared expert's rows padded to 128 with zeros: its own copy of x (else it reads io.x).
    if (rank.shared.x != rank.io.x) {
      copy_unless_same(rank.local.buffers().shared_x, a.x, rows, stream, "MoELayer: cudaMemcpyAsync(shared x)");
    }
    write_shared_gates(a.shared_scale, sizes.tokens, rank.local.buffers().shared_gates, stream);
  }
}

void replay_schedule(LayerState& state, const std::vector<MoEForwardArgs>& args, cudaStream_t stream) {
  stage_inputs(state, args, stream);
  if (state.sizes.has_shared) {
    for (size_t l = 0; l < args.size(); ++l) {
      gemm::expert_up_gate(state.ranks[l].shared, {args[l].weights.shared_w_gate_up, args[l].weights.shared_w_down},
                           stream);
    }
  }
  state.exchange->build_schedule(state.config.router, stream);
}

void shared_forward_and_schedule(LayerState& state, const std::vector<MoEForwardArgs>& args, cudaStream_t stream) {
  for (size_t l = 0; l < args.size() && state.sizes.has_shared; ++l) {
    gemm::expert_forward(state.ranks[l].shared, {args[l].weights.shared_w_gate_up, args[l].weights.shared_w_down},
                         stream);
  }
  state.exchange->build_schedule(state.config.router, stream);
}

void shared_backward(LayerState& state, size_t l, const MoEBackwardArgs& grads, const MoEWeights& weights,
                     cudaStream_t stream) {
  const RankState& rank = state.ranks[l];
  const int64_t rows = static_cast<int64_t>(state.sizes.tokens) * state.sizes.hidden;
  gemm::expert_backward(rank.shared, {weights.shared_w_gate_up, weights.shared_w_down},
                        {grads.d_shared_w_gate_up, grads.d_shared_w_down, grads.d_shared_w_gate_up_bf16,
                         grads.d_shared_w_down_bf16},
                        stream);
  copy_unless_same(rank.shared_dx_slot, rank.shared.dx, rows, stream, "MoELayer::backward: cudaMemcpyAsync(shared dx)");
}

void copy_shared_scale_grad(LayerState& state, size_t l, const MoEBackwardArgs& grads, cudaStream_t stream) {
  if (grads.d_shared_scale == nullptr) return;
  copy_unless_same(grads.d_shared_scale, state.ranks[l].shared.dg, state.sizes.tokens, stream,
                   "MoELayer::backward: cudaMemcpyAsync(d_shared_scale)");
}

}  // namespace caracal::layer
