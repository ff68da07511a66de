// MoELayer v1: the token exchange and the grouped-GEMM engine as separate launches on one stream.
//
// forward:   stage inputs | shared expert (local tokens) | build_schedule | compute_gates |
//            dispatch | routed experts (per local rank) | shared rows scaled | combine | y out
//            (fused: the shared expert, dispatch, the routed experts and combine's push of every
//            local rank in one launch after compute_gates, then combine_filled_slots)
// backward:  (replay, when a later forward or a backward overwrote this one's activations: stage
//            inputs | shared expert's up/gate | build_schedule | compute_gates | dispatch | routed
//            up/gate) | stage dy | (fused forward, no replay: dispatch, routed up/gate of the rows
//            past the ring) | reverse_combine | routed experts' backward (per local rank, in place;
//            the dx GEMM stores the rows home) | shared expert's backward |
//            reverse_dispatch_filled_dx_slots | dx, d_topk_scores out
// Cross-rank ordering comes only from the exchange launches' world barriers; everything between
// them is local to a rank and ordered by the stream.
#include "caracal/moe_layer.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "caracal/comm/cuda_check.hpp"
#include "caracal/error.hpp"
#include "caracal/gemm/expert_pass.hpp"
#include "caracal/plan.hpp"
#include "caracal/transfer/token_exchange.hpp"
#include "fused/dx_to_home.hpp"
#include "fused/fused_forward.hpp"
#include "layer/argument_checks.hpp"
#include "layer/device_checks.hpp"
#include "layer/layer_sizes.hpp"
#include "layer/local_buffers.hpp"
#include "layer/poison_outputs.hpp"
#include "layer/shared_rows.hpp"

namespace caracal {

namespace {

using bf16 = __nv_bfloat16;
constexpr const char* kForward = "MoELayer::forward";
constexpr const char* kBackward = "MoELayer::backward";

// Copies `count` elements on `stream` unless both name the same buffer (the zero-copy path).
template <typename T>
void copy_unless_same(T* dst, const T* src, int64_t count, cudaStream_t stream, const char* what) {
  if (dst == src) return;
  check_cuda(cudaMemcpyAsync(dst, src, static_cast<size_t>(count) * sizeof(T), cudaMemcpyDeviceToDevice, stream),
             what);
}

// One local rank: its own buffers and the two expert passes wired to them and to its heap.
struct RankState {
  layer::LocalMemory local;
  MoELayerBuffers io;            // the exchange's input/output buffers (zero-copy path)
  gemm::ExpertPass routed;      // L experts over the schedule's rows
  gemm::ExpertPass shared;      // the shared expert over the rank's tokens (unused without one)
  bf16* shared_out_slot = nullptr;  // the exchange's shared_out input of combine
  bf16* shared_dx_slot = nullptr;   // the exchange's shared_dx input of reverse_dispatch

  std::vector<const void*> owned() const {
    return {io.x, io.topk_idx, io.topk_scores, io.y, io.dy, io.dx, io.d_topk_scores};
  }
};

// Throws caracal::Error on every rank unless all ranks of `world` hold the same configuration
// (collective; before anything else, so that no rank throws alone and leaves the others waiting).
void require_same_config(const LayerConfig& config, comm::World& world) {
  int64_t scale_bits = 0;
  static_assert(sizeof(scale_bits) == sizeof(config.router.scale));
  std::memcpy(&scale_bits, &config.router.scale, sizeof(scale_bits));
  world.require_same_on_all_ranks(
      "MoELayer",
      {"hidden", "intermediate", "num_experts", "top_k", "num_shared_experts", "shared_intermediate",
       "tokens_per_rank", "ep_size", "precision", "router.normalize", "router.scale (bits)"},
      {config.shape.hidden, config.shape.intermediate, config.shape.num_experts, config.shape.top_k,
       config.shape.num_shared_experts, config.shape.shared_intermediate, config.tokens_per_rank, config.ep_size,
       static_cast<int64_t>(config.precision), config.router.normalize ? 1 : 0, scale_bits});
}

// Whether the layer's buffers are the fused forward's (no expert_out): MoELayer runs the fused
// forward on worlds of at most kFusedMaxLocalRanks local ranks, so with more ranks than that, which
// a loopback world may hold, it keeps v1's.
bool allocates_fused_forward(const LayerConfig& config, const MoELayerOptions& options) {
  return options.fused_forward && config.ep_size <= fused::kFusedMaxLocalRanks;
}

RankState make_rank_state(const layer::LayerSizes& sizes, const transfer::TokenExchange& exchange,
                          const comm::World& world, int l, const MoELayerOptions& options) {
  const int gemm_ctas = options.gemm_ctas;
  RankState state{layer::LocalMemory(sizes, options.local_allocator), {}, {}, {}, nullptr, nullptr};
  const layer::LocalBuffers& local = state.local.buffers();
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
  routed.x = at(fwd.expert_x);
  routed.gate_up = local.gate_up;
  routed.activation = local.activation;
  routed.out = exchange.options().expert_out ? at(fwd.expert_out) : nullptr;  // the fused forward stores rows home
  routed.dy = at(bwd.expert_dy);
  routed.gates = at(bwd.expert_gates);
  routed.d_gate_up = local.gate_up;  // in place (gemm::expert_backward)
  routed.dg = at(bwd.expert_dg);
  routed.workspace = local.workspace;
  routed.dx = nullptr;  // the dx rows go to their home slots (fused::gate_up_dgrad_to_home)
  if (!sizes.has_shared) return state;

  gemm::ExpertPass& shared = state.shared;
  shared.rows = ScheduleView{local.shared_offset, local.shared_count, 1, sizes.shared_rows};
  shared.hidden = sizes.hidden;
  shared.intermediate = sizes.shared_intermediate;
  shared.num_ctas = gemm_ctas;
  shared.x = local.shared_x;
  shared.gate_up = local.shared_gate_up;
  shared.activation = local.shared_activation;
  shared.out = local.shared_out;
  shared.dy = local.shared_dy;
  shared.gates = local.shared_gates;
  shared.d_gate_up = local.shared_gate_up;  // in place, as the routed experts'

  shared.dg = local.shared_dg;
  shared.workspace = local.shared_workspace;
  shared.dx = local.shared_x;  // in place, as the routed experts'

  state.shared_out_slot = at(fwd.shared_out);
  state.shared_dx_slot = at(bwd.shared_dx);
  return state;
}

}  // namespace

struct MoELayer::Impl {
  layer::LayerSizes sizes;
  std::unique_ptr<transfer::TokenExchange> exchange;
  std::vector<RankState> ranks;
  bool fused_forward = false;
  int fused_comm_ctas = 0;
  int ring_rows = 0;  // the fused forward's ring: at most the routed rows
  bool pull_all_rows = false;

  // Copies every rank's x, topk_idx, topk_scores into the exchange's buffers, and x and the
  // shared expert's scales into its rows.
  void stage_inputs(const std::vector<MoEForwardArgs>& args, cudaStream_t stream);
  // What backward reads of forward `args` (schedule, gates, dispatched rows, gate/up of the routed
  // and shared experts), recomputed with the forward's own launches: bitwise the same.
  void replay_forward(const std::vector<MoEForwardArgs>& args, const RouterNormalization& router, cudaStream_t stream);
};

void MoELayer::Impl::stage_inputs(const std::vector<MoEForwardArgs>& args, cudaStream_t stream) {
  const int64_t rows = static_cast<int64_t>(sizes.tokens) * sizes.hidden;
  const int64_t routes = static_cast<int64_t>(sizes.tokens) * sizes.top_k;
  for (size_t l = 0; l < args.size(); ++l) {
    const MoEForwardArgs& a = args[l];
    RankState& rank = ranks[l];
    copy_unless_same(rank.io.x, a.x, rows, stream, "MoELayer: cudaMemcpyAsync(x)");
    copy_unless_same(rank.io.topk_idx, a.topk_idx, routes, stream, "MoELayer: cudaMemcpyAsync(topk_idx)");
    copy_unless_same(rank.io.topk_scores, a.topk_scores, routes, stream, "MoELayer: cudaMemcpyAsync(topk_scores)");
    if (!sizes.has_shared) continue;
    // The shared expert's rows are padded to 128 with zeros: its own copy of x.
    copy_unless_same(rank.local.buffers().shared_x, a.x, rows, stream, "MoELayer: cudaMemcpyAsync(shared x)");
    layer::write_shared_gates(a.shared_scale, sizes.tokens, rank.local.buffers().shared_gates, stream);
  }
}

void MoELayer::Impl::replay_forward(const std::vector<MoEForwardArgs>& args, const RouterNormalization& router,
                                    cudaStream_t stream) {
  stage_inputs(args, stream);
  if (sizes.has_shared) {
    for (size_t l = 0; l < args.size(); ++l) {
      gemm::expert_up_gate(ranks[l].shared, {args[l].weights.shared_w_gate_up, args[l].weights.shared_w_down}, stream);
    }
  }
  exchange->build_schedule(stream);
  exchange->compute_gates(router, stream);
  exchange->dispatch(stream);
  for (size_t l = 0; l < args.size(); ++l) {
    gemm::expert_up_gate(ranks[l].routed, {args[l].weights.w_gate_up, args[l].weights.w_down}, stream);
  }
}

MoELayerMemory MoELayer::memory(const LayerConfig& config, const MoELayerOptions& options) {
  const layer::LayerSizes sizes = layer::layer_sizes(config);
  MoELayerMemory m;
  m.heap = transfer::TokenExchange::heap_bytes(layer::exchange_shape(config), sizes.world_size,
                                               layer::exchange_options(config, allocates_fused_forward(config, options)));
  m.local = layer::local_bytes(sizes);
  return m;
}

MoELayer::MoELayer(const LayerConfig& config, comm::World& world, const MoELayerOptions& options)
    : config_(config), world_(world), impl_(std::make_unique<Impl>()) {
  // First, before anything can throw on some ranks only: every rank must hold the same
  // configuration (collective).
  require_same_config(config, world);
  Impl& state = *impl_;
  state.sizes = layer::layer_sizes(config);
  CARACAL_CHECK(options.gemm_ctas >= 0, "MoELayer: options.gemm_ctas must be >= 0 (0: one per SM), got ",
                options.gemm_ctas);
  CARACAL_CHECK(options.exchange_sms >= 0 && options.exchange_sms <= world.multiprocessors(),
                "MoELayer: options.exchange_sms must be in [0, ", world.multiprocessors(),
                "] (0: all but 16 of the device's SMs), got ", options.exchange_sms);
  CARACAL_CHECK(static_cast<bool>(options.local_allocator.allocate) == static_cast<bool>(options.local_allocator.free),
                "MoELayer: options.local_allocator needs both allocate and free, or neither (cudaMalloc)");
  CARACAL_CHECK(config.ep_size == world.world_size(), "MoELayer: config.ep_size (", config.ep_size,
                ") must equal the world's size (", world.world_size(), ")");
  layer::check_current_device(world.device(), "MoELayer");
  const size_t heap = memory(config, options).heap;
  CARACAL_CHECK(heap <= world.heap_bytes_left(), "MoELayer: needs ", heap,
                " bytes of symmetric heap per rank (MoELayer::heap_bytes(config, options)), but the world has ",
                world.heap_bytes_left(), " left");
  transfer::ExchangeOptions exchange = layer::exchange_options(config, allocates_fused_forward(config, options));
  exchange.max_sms = options.exchange_sms;
  state.exchange = std::make_unique<transfer::TokenExchange>(world, layer::exchange_shape(config), exchange);
  state.fused_forward = options.fused_forward && world.local_ranks() <= fused::kFusedMaxLocalRanks;
  if (state.fused_forward) {
    const int ctas = fused::fused_ctas_per_rank(world);
    CARACAL_CHECK(options.fused_comm_ctas >= 0 && options.fused_comm_ctas < ctas,
                  "MoELayer: options.fused_comm_ctas must be in [0, ", ctas - 1, "] (0: ",
                  fused::default_comm_ctas(world), " on this device), got ", options.fused_comm_ctas);
    state.fused_comm_ctas = options.fused_comm_ctas;
    CARACAL_CHECK(options.ring_rows >= 0 && options.ring_rows % gemm::kGroupedGemmTileM == 0,
                  "MoELayer: options.ring_rows must be 0 (default) or a positive multiple of ", gemm::kGroupedGemmTileM,
                  ", got ", options.ring_rows);
    const int64_t ring = options.ring_rows > 0 ? options.ring_rows : default_ring_rows(config, world.multiprocessors());
    state.ring_rows = static_cast<int>(std::min<int64_t>(ring, state.sizes.routed_rows));
    state.pull_all_rows = options.fused_pull_all_rows;
  }
  state.ranks.reserve(static_cast<size_t>(world.local_ranks()));
  for (int l = 0; l < world.local_ranks(); ++l) {
    state.ranks.push_back(make_rank_state(state.sizes, *state.exchange, world, l, options));
  }
}

MoELayer::~MoELayer() = default;

MoELayerBuffers MoELayer::buffers(int local_rank) const {
  CARACAL_CHECK(local_rank >= 0 && local_rank < world_.local_ranks(), "MoELayer::buffers: local_rank must be in [0, ",
                world_.local_ranks(), "), got ", local_rank);
  return impl_->ranks[static_cast<size_t>(local_rank)].io;
}

void MoELayer::check() { impl_->exchange->check(); }

void MoELayer::reset(cudaStream_t stream) {
  layer::check_current_device(world_.device(), "MoELayer::reset");
  world_.reset(stream);
  reset_floor_ = latest_forward_;  // earlier forwards' passes were cut short: their contexts are refused
  held_forward_ = 0;
}

MoEContext MoELayer::context(uint64_t forward_id, const std::vector<MoEForwardArgs>& ranks) const {
  constexpr const char* kContext = "MoELayer::context";
  CARACAL_CHECK(forward_id > reset_floor_ && forward_id <= latest_forward_, kContext,
                ": forward_id must name a forward of this layer since its last reset(), in [", reset_floor_ + 1, ", ",
                latest_forward_, "], got ", forward_id);
  layer::check_rank_count(ranks.size(), world_.local_ranks(), kContext);
  for (int l = 0; l < world_.local_ranks(); ++l) {
    const auto i = static_cast<size_t>(l);
    const std::vector<layer::PointerArg> args = layer::forward_pointer_args(ranks[i], impl_->sizes, false);
    layer::check_pointer_args(args, kContext, l);
    layer::check_pointer_devices(args, impl_->ranks[i].owned(), world_.device(), kContext, l);
  }
  MoEContext context;
  context.layer_ = this;
  context.forward_id_ = forward_id;
  context.ranks_ = ranks;
  return context;
}

MoEContext MoELayer::forward(const MoEForwardArgs& rank, cudaStream_t stream) {
  return forward(std::vector<MoEForwardArgs>{rank}, stream);
}

void MoELayer::backward(const MoEBackwardArgs& rank, const MoEContext& context, cudaStream_t stream) {
  backward(std::vector<MoEBackwardArgs>{rank}, context, stream);
}

MoEContext MoELayer::forward(const std::vector<MoEForwardArgs>& ranks, cudaStream_t stream) {
  Impl& state = *impl_;
  const layer::LayerSizes& sizes = state.sizes;
  const layer::RelaxedCaptureScope relaxed;
  layer::check_current_device(world_.device(), kForward);
  world_.check();  // a faulted world refuses work until reset()
  layer::check_rank_count(ranks.size(), world_.local_ranks(), kForward);
  for (int l = 0; l < world_.local_ranks(); ++l) {
    const std::vector<layer::PointerArg> args = layer::forward_pointer_args(ranks[static_cast<size_t>(l)], sizes);
    layer::check_pointer_args(args, kForward, l);
    layer::check_pointer_devices(args, state.ranks[static_cast<size_t>(l)].owned(), world_.device(), kForward, l);
  }

  const int64_t rows = static_cast<int64_t>(sizes.tokens) * sizes.hidden;
  state.stage_inputs(ranks, stream);
  if (!state.fused_forward) {
    for (size_t l = 0; l < ranks.size(); ++l) {
      if (!sizes.has_shared) break;
      gemm::expert_forward(state.ranks[l].shared, {ranks[l].weights.shared_w_gate_up, ranks[l].weights.shared_w_down},
                           stream);
    }
  }
  state.exchange->build_schedule(stream);
  state.exchange->compute_gates(config_.router, stream);
  if (state.fused_forward) {
    fused::FusedForwardArgs fused_args;
    fused_args.exchange = state.exchange.get();
    fused_args.comm_ctas = state.fused_comm_ctas;
    fused_args.pull_all_rows = state.pull_all_rows;
    for (size_t l = 0; l < ranks.size(); ++l) {
      const MoEWeights& w = ranks[l].weights;
      const RankState& rank_state = state.ranks[l];
      gemm::ExpertPass routed = rank_state.routed;
      routed.rows.ring_rows = state.ring_rows;
      fused_args.ranks.push_back({routed, {w.w_gate_up, w.w_down}, sizes.has_shared, rank_state.shared,
                                  {w.shared_w_gate_up, w.shared_w_down}, rank_state.local.buffers().ready_counters});
    }
    fused::fused_forward(world_, fused_args, stream);
  } else {
    state.exchange->dispatch(stream);
    for (size_t l = 0; l < ranks.size(); ++l) {
      gemm::expert_forward(state.ranks[l].routed, {ranks[l].weights.w_gate_up, ranks[l].weights.w_down}, stream);
    }
  }
  // The shared expert's rows into combine's input: scaled by c_t, or as they are.
  for (size_t l = 0; l < ranks.size(); ++l) {
    const RankState& rank_state = state.ranks[l];
    if (!sizes.has_shared) break;
    if (ranks[l].shared_scale != nullptr) {
      layer::scale_rows(rank_state.shared.out, rank_state.shared.gates, sizes.tokens, sizes.hidden,
                        rank_state.shared_out_slot, stream);
    } else {
      copy_unless_same(rank_state.shared_out_slot, rank_state.shared.out, rows, stream,
                       "MoELayer::forward: cudaMemcpyAsync(shared out)");
    }
  }
  if (state.fused_forward) {
    state.exchange->combine_filled_slots(stream);  // the fused down tiles stored every routed row home
  } else {
    state.exchange->combine(stream);
  }
  std::vector<layer::PoisonSpan> outputs;
  for (size_t l = 0; l < ranks.size(); ++l) {
    copy_unless_same(ranks[l].y, state.ranks[l].io.y, rows, stream, "MoELayer::forward: cudaMemcpyAsync(y)");
    outputs.push_back({ranks[l].y, static_cast<size_t>(rows) * sizeof(bf16), world_.abort_word(static_cast<int>(l))});
  }
  layer::poison_if_aborted(outputs, stream);

  MoEContext context;
  context.layer_ = this;
  context.forward_id_ = ++latest_forward_;
  context.ranks_ = ranks;
  held_forward_ = latest_forward_;
  return context;
}

void MoELayer::backward(const std::vector<MoEBackwardArgs>& ranks, const MoEContext& context, cudaStream_t stream) {
  Impl& state = *impl_;
  const layer::LayerSizes& sizes = state.sizes;
  const layer::RelaxedCaptureScope relaxed;
  layer::check_current_device(world_.device(), kBackward);
  world_.check();  // a faulted world refuses work until reset()
  CARACAL_CHECK(context.layer_ == this && context.forward_id_ > reset_floor_ && context.forward_id_ <= latest_forward_,
                kBackward, ": the context must come from a forward of this layer since its last reset() (forwards ",
                reset_floor_ + 1, " to ", latest_forward_, "), got ",
                context.layer_ == nullptr ? std::string("an empty context")
                : context.layer_ != this  ? std::string("another layer's")
                                          : "forward " + std::to_string(context.forward_id_));
  layer::check_rank_count(ranks.size(), world_.local_ranks(), kBackward);
  const bool replay = context.forward_id_ != held_forward_;
  for (int l = 0; l < world_.local_ranks(); ++l) {
    const auto i = static_cast<size_t>(l);
    const MoEForwardArgs& forward = context.ranks_[i];
    const std::vector<layer::PointerArg> args =
        layer::backward_pointer_args(ranks[i], sizes, forward.shared_scale != nullptr);
    layer::check_pointer_args(args, kBackward, l);
    layer::check_pointer_devices(args, state.ranks[i].owned(), world_.device(), kBackward, l);
    const MoELayerBuffers& own = state.ranks[i].io;
    // The layer's own input buffers hold the latest forward's inputs until the next forward.
    const bool inputs_rewritten = context.forward_id_ != latest_forward_;
    CARACAL_CHECK(!replay || !inputs_rewritten ||
                      (forward.x != own.x && forward.topk_idx != own.topk_idx && forward.topk_scores != own.topk_scores),
                  kBackward, ": forward ", context.forward_id_, " read ranks[", l,
                  "]'s inputs from the layer's own buffers (MoELayer::buffers, zero-copy), which a later forward "
                  "rewrote, so its activations cannot be replayed: give a forward whose backward comes after another "
                  "forward x, topk_idx and topk_scores of your own");
  }
  if (replay) {
    state.replay_forward(context.ranks_, config_.router, stream);
    held_forward_ = context.forward_id_;
  }

  const int64_t rows = static_cast<int64_t>(sizes.tokens) * sizes.hidden;
  const int64_t routes = static_cast<int64_t>(sizes.tokens) * sizes.top_k;
  for (size_t l = 0; l < ranks.size(); ++l) {
    RankState& rank_state = state.ranks[l];
    copy_unless_same(rank_state.io.dy, ranks[l].dy, rows, stream, "MoELayer::backward: cudaMemcpyAsync(dy)");
    if (sizes.has_shared) {
      copy_unless_same(rank_state.local.buffers().shared_dy, ranks[l].dy, rows, stream,
                       "MoELayer::backward: cudaMemcpyAsync(shared dy)");
    }
  }

  // The fused forward read the x rows of tokens on this GPU in place and left macrobatch 0 in its
  // ring, the routed rows' first ring_rows buffer rows: the weight gradients read every row's x
  // from expert_x, and the rows past the ring get their gate/up and activation again (a replay
  // has done both already).
  if (state.fused_forward && !replay) {
    state.exchange->dispatch(stream);
    if (state.ring_rows < sizes.routed_rows) {
      for (size_t l = 0; l < ranks.size(); ++l) {
        gemm::ExpertPass past_ring = state.ranks[l].routed;
        past_ring.rows.first_row = state.ring_rows;
        const MoEWeights& w = context.ranks_[l].weights;
        gemm::expert_up_gate(past_ring, {w.w_gate_up, w.w_down}, stream);
      }
    }
  }
  state.exchange->reverse_combine(stream);
  for (size_t l = 0; l < ranks.size(); ++l) {
    const MoEBackwardArgs& a = ranks[l];
    const MoEWeights& w = context.ranks_[l].weights;
    RankState& rank_state = state.ranks[l];
    gemm::expert_backward_before_dx(rank_state.routed, {w.w_gate_up, w.w_down},
                                    {a.d_w_gate_up, a.d_w_down, a.d_w_gate_up_bf16, a.d_w_down_bf16}, stream);
    // dx rows straight into their home slots (reverse dispatch's push in the GEMM's epilogue).
    fused::gate_up_dgrad_to_home(world_, *state.exchange, static_cast<int>(l), rank_state.routed,
                                 {w.w_gate_up, w.w_down}, stream);
    if (!sizes.has_shared) continue;
    gemm::expert_backward(
        rank_state.shared, {w.shared_w_gate_up, w.shared_w_down},
        {a.d_shared_w_gate_up, a.d_shared_w_down, a.d_shared_w_gate_up_bf16, a.d_shared_w_down_bf16}, stream);
    copy_unless_same(rank_state.shared_dx_slot, rank_state.shared.dx, rows, stream, "MoELayer::backward: cudaMemcpyAsync(shared dx)");
    if (a.d_shared_scale != nullptr) {
      copy_unless_same(a.d_shared_scale, rank_state.shared.dg, sizes.tokens, stream,
                       "MoELayer::backward: cudaMemcpyAsync(d_shared_scale)");
    }
  }
  state.exchange->reverse_dispatch_filled_dx_slots(config_.router, stream);
  std::vector<layer::PoisonSpan> outputs;
  for (size_t l = 0; l < ranks.size(); ++l) {
    const RankState& rank_state = state.ranks[l];
    copy_unless_same(ranks[l].dx, rank_state.io.dx, rows, stream, "MoELayer::backward: cudaMemcpyAsync(dx)");
    copy_unless_same(ranks[l].d_topk_scores, rank_state.io.d_topk_scores, routes, stream,
                     "MoELayer::backward: cudaMemcpyAsync(d_topk_scores)");
    for (const layer::OutputBuffer& out : layer::backward_outputs(ranks[l], sizes)) {
      outputs.push_back({out.data, out.bytes, world_.abort_word(static_cast<int>(l))});
    }
  }
  layer::poison_if_aborted(outputs, stream);
  held_forward_ = 0;  // the backward worked in place over the activations (gemm::expert_backward)
}

}  // namespace caracal
