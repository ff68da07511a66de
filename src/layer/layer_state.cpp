#include "layer/layer_state.hpp"

#include "layer/shared_rows.hpp"

namespace caracal::layer {

namespace {

// The FP8 twin of bf16 pass `p`: its rows, shape, CTAs, tile queue and bf16 buffers, with e4m3 rows
// of x, the activation, dy and d_gate_up; with FP8 weight gradients each e4m3 buffer also takes its
// rows' columns once the backward is done with the rows (gemm::Fp8ExpertPass).
gemm::Fp8ExpertPass fp8_twin(const gemm::ExpertPass& p, const gemm::Fp8RowOutput& x,
                             const gemm::Fp8RowOutput& activation, const gemm::Fp8RowOutput& dy,
                             const gemm::Fp8RowOutput& d_gate_up, bool fp8_weight_grads) {
  gemm::Fp8ExpertPass f;
  f.rows = p.rows;
  f.hidden = p.hidden;
  f.intermediate = p.intermediate;
  f.num_ctas = p.num_ctas;
  f.tile_queue = p.tile_queue;
  f.x = p.x;
  f.x_fp8 = x;
  f.gate_up = p.gate_up;
  f.activation = p.activation;
  f.activation_fp8 = activation;
  f.out = p.out;
  f.dy = p.dy;
  f.dy_fp8 = dy;
  f.gates = p.gates;
  f.d_gate_up = p.d_gate_up;  // in place over gate_up, as p's
  f.d_gate_up_fp8 = d_gate_up;
  f.dg = p.dg;
  f.workspace = p.workspace;
  f.dx = p.dx;
  if (fp8_weight_grads) {
    const auto columns = [](const gemm::Fp8RowOutput& r) { return gemm::Fp8ColumnOutput{r.codes, r.scales}; };
    f.x_columns = columns(x);
    f.dy_columns = columns(dy);
    f.d_gate_up_columns = columns(d_gate_up);
    f.activation_columns = columns(activation);
  }
  return f;
}

}  // namespace

RankState make_rank_state(const LayerSizes& sizes, const transfer::TokenExchange& exchange, const comm::World& world,
                          int l, const MoELayerOptions& options) {
  const int gemm_ctas = options.gemm_ctas;
  // The GEMMs take their row tiles in order from the rank's tile queue (their operands then stay in
  // L2), which serves at most kTileQueueMaxCtas CTAs; more take them at a fixed stride.
  const bool tile_queue = gemm_ctas <= gemm::kTileQueueMaxCtas;
  RankState state{LocalMemory(sizes, options.local_allocator), {}, {}, {}, {}, {}, {}, nullptr, {}, {}, nullptr, nullptr};
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
    state.routed_fp8 = fp8_twin(routed, {at(fwd.expert_x_codes), at(fwd.expert_x_scales)},  // dispatch_fp8's
                                local.activation_fp8, local.dy_fp8, local.d_gate_up_fp8, sizes.fp8_weight_grads);
    state.routed_fp8.dx = at(bwd.expert_dx);  // reverse_dispatch takes the rows home
    if (sizes.fp8_weight_grads) {
      // x's columns in its bf16 rows' memory (R x D x 2 bytes): the backward quantizes them from
      // x_fp8's e4m3 rows (the FP8 plan passes x null), and no launch of it reads the bf16 rows.
      uint8_t* const x_rows = reinterpret_cast<uint8_t*>(at(fwd.expert_x));
      const size_t x_codes = size_t(sizes.ring_rows) * size_t(sizes.hidden);
      state.routed_fp8.x_columns = {reinterpret_cast<__nv_fp8_e4m3*>(x_rows), reinterpret_cast<float*>(x_rows + x_codes)};
    }
    state.weights_fp8 = local.weights_fp8;
    CARACAL_CHECK(exchange.sizes().home_rows == sizes.shared_rows, "MoELayer: the exchange's home rows (",
                  exchange.sizes().home_rows, ") must be the shared rows (", sizes.shared_rows, ")");
    state.home_x_fp8 = {at(fwd.x_codes), at(fwd.x_scales)};
    if (exchange.options().fp8_reverse_combine) {
      state.home_dy_fp8 = {at(bwd.dy_codes), at(bwd.dy_scales)};
      state.expert_dy_fp8 = {at(bwd.expert_dy_codes), at(bwd.expert_dy_scales)};
    }
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
    state.shared_fp8 = fp8_twin(shared, local.shared_x_fp8, local.shared_activation_fp8, local.shared_dy_fp8,
                                local.shared_d_gate_up_fp8, sizes.fp8_weight_grads);
    // Its x rows are x's home codes (the FP8 plan quantizes x there over the shared rows);
    // shared_x_fp8 keeps their columns for the weight gradients.
    state.shared_fp8.x_fp8 = state.home_x_fp8;
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
                        shared_gradients(grads), stream);
  copy_unless_same(rank.shared_dx_slot, rank.shared.dx, rows, stream, "MoELayer::backward: cudaMemcpyAsync(shared dx)");
}

void copy_shared_scale_grad(LayerState& state, size_t l, const MoEBackwardArgs& grads, cudaStream_t stream) {
  if (grads.d_shared_scale == nullptr) return;
  copy_unless_same(grads.d_shared_scale, state.ranks[l].shared.dg, state.sizes.tokens, stream,
                   "MoELayer::backward: cudaMemcpyAsync(d_shared_scale)");
}

}  // namespace caracal::layer
