// MoELayer v1: the token exchange and the grouped-GEMM engine as separate launches on one stream.
//
// forward:   stage inputs | shared expert (local tokens) | build_schedule (and the gates) |
//            dispatch | routed experts (per local rank) | shared rows scaled | combine | y out
//            (fused: the shared expert, dispatch, the routed experts and combine's push of every
//            local rank in one launch after build_schedule, then combine_after_fused_forward)
// backward:  (replay, when a later forward or a backward overwrote this one's activations: stage
//            inputs | shared expert's up/gate | build_schedule (and the gates) | v1: dispatch,
//            routed up/gate) | stage dy | per macrobatch of the ring, ascending (v1: one, all rows):
//            (fused: dispatch of its rows | routed up/gate, but for macrobatch 0 after a forward)
//            | reverse_combine of its rows | routed experts' backward (per local rank, in place;
//            weight gradients continued across macrobatches; the dx GEMM stores the rows home)
//            (fused_backward: reverse_combine of its padding rows | one launch: the others' dy
//            pulled, this GPU's dy and macrobatch 0's x copied, macrobatch 0's with the shared
//            expert's dgrad+SwiGLU and dx tiles first, dgrad+SwiGLU and dx tiles, at W > 1 the dx
//            rows of other ranks' tokens summed per (token, rank) before they go home | weight
//            gradients) |
//            shared expert's backward (fused_backward: its weight gradients) |
//            reverse_dispatch_filled_dx_slots | dx, d_topk_scores out
//            (fused_backward in a world of one rank: the last macrobatch's weight gradients after
//            the shared expert's, the reverse dispatch's sums on their idle warps)
// Cross-rank ordering comes only from the exchange launches' world barriers; everything between
// them is local to a rank and ordered by the stream.
#include "caracal/moe_layer.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "caracal/comm/cuda_check.hpp"
#include "caracal/error.hpp"
#include "caracal/gemm/expert_pass.hpp"
#include "caracal/transfer/token_exchange.hpp"
#include "fused/dx_to_home.hpp"
#include "fused/fused_backward.hpp"
#include "fused/fused_forward.hpp"
#include "fused/weight_grads_dx_sums.hpp"
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

// Throws caracal::Error on every rank unless all ranks of `world` hold the same configuration and
// options as far as the heap and the rows between ranks go (layer::values_ranks_agree_on;
// collective: before anything else, so that no rank throws alone and leaves the others waiting).
void require_same_config(const LayerConfig& config, const MoELayerOptions& options, comm::World& world) {
  std::vector<const char*> names;
  std::vector<int64_t> values;
  for (const layer::AgreedValue& v : layer::values_ranks_agree_on(config, options, world.multiprocessors())) {
    names.push_back(v.name);
    values.push_back(v.value);
  }
  world.require_same_on_all_ranks("MoELayer", names, values);
}

// The SMs of the current CUDA device, whose count the default ring follows; 132 (H100, H200) where
// there is none (a host without a GPU: the planner's default).
int current_device_multiprocessors() {
  int device = 0, count = 0;
  if (cudaGetDevice(&device) == cudaSuccess &&
      cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) == cudaSuccess && count > 0) {
    return count;
  }
  (void)cudaGetLastError();  // no device here: not an error of the caller's
  return 132;
}

RankState make_rank_state(const layer::LayerSizes& sizes, const transfer::TokenExchange& exchange,
                          const comm::World& world, int l, const MoELayerOptions& options) {
  const int gemm_ctas = options.gemm_ctas;
  // The GEMMs take their row tiles in order from the rank's tile queue (their operands then stay in
  // L2), which serves at most kTileQueueMaxCtas CTAs; more take them at a fixed stride.
  const bool tile_queue = gemm_ctas <= gemm::kTileQueueMaxCtas;
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
  routed.dx = nullptr;  // the dx rows go to their home slots (fused::gate_up_dgrad_to_home)
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
  return state;
}

}  // namespace

struct MoELayer::Impl {
  layer::LayerSizes sizes;
  std::unique_ptr<transfer::TokenExchange> exchange;
  std::vector<RankState> ranks;
  bool fused = false;  // the fused forward and the backward over the ring (sizes.ring_rows)
  bool fused_backward = false;  // with fused: the backward's fused launch per macrobatch
  bool dx_sums_in_weight_grads = false;  // with fused_backward: MoELayerOptions's
  int fused_comm_ctas = 0;
  bool pull_all_rows = false;
  bool local_rows_in_launch = false;  // with fused_backward: fused::FusedBackwardArgs's

  // How the routed backward fills the dx slots.
  transfer::DxSlots dx_slots() const {
    return fused && fused_backward && fused::groups_dx_rows(*exchange) ? transfer::DxSlots::kPerTokenRank
                                                                       : transfer::DxSlots::kPerRoute;
  }
  // Whether the reverse dispatch's sums ride on the last macrobatch's weight gradients
  // (fused::weight_grads_with_dx_sums), which then come after the shared expert's backward.
  bool dx_sums_ride(const comm::World& world) const {
    return fused && fused_backward && dx_sums_in_weight_grads && fused::rides_dx_sums(world, dx_slots());
  }
  // The schedule rows [first_row, end_row) of macrobatch `window` of the ring (in buffer rows
  // [0, end_row - first_row)); v1: {0, 0}, all of them.
  struct WindowRows {
    int first_row, end_row;
  };
  WindowRows window_rows(int window) const {
    const int first_row = fused ? window * sizes.ring_rows : 0;
    return {first_row, fused ? std::min(first_row + sizes.ring_rows, sizes.routed_rows) : 0};
  }
  // Local rank l's routed pass over those rows.
  gemm::ExpertPass window_pass(size_t l, int window) const {
    gemm::ExpertPass pass = ranks[l].routed;
    const WindowRows rows = window_rows(window);
    pass.rows.first_row = rows.first_row;
    pass.rows.end_row = rows.end_row;
    return pass;
  }
  // Where its weight gradients go: bf16 ones keep the sums of an expert cut by the window's edges in
  // fp32, the partial buffers taking turns window by window.
  gemm::ExpertPassGradients window_gradients(const MoEBackwardArgs& a, size_t l, int window) const {
    const layer::LocalBuffers& local = ranks[l].local.buffers();
    gemm::ExpertPassGradients grads{a.d_w_gate_up, a.d_w_down, a.d_w_gate_up_bf16, a.d_w_down_bf16};
    grads.partial_in = window > 0 ? local.weight_grad_partials[(window + 1) % 2] : nullptr;
    grads.partial_out = local.weight_grad_partials[window % 2];
    return grads;
  }

  // Copies every rank's x, topk_idx, topk_scores into the exchange's buffers, and x and the
  // shared expert's scales into its rows.
  void stage_inputs(const std::vector<MoEForwardArgs>& args, cudaStream_t stream);
  // What backward reads of forward `args` (schedule, gates, the shared expert's gate/up and, for
  // v1, the dispatched rows and the routed experts' gate/up; the fused backward recomputes those
  // macrobatch by macrobatch), recomputed with the forward's own launches: bitwise the same.
  void replay_forward(const std::vector<MoEForwardArgs>& args, const RouterNormalization& router, cudaStream_t stream);
  // Backward of the routed experts over the rows [first_row, end_row) (a macrobatch of the ring;
  // v1: {0, 0}, all of them), their dx rows stored home; `window` counts the macrobatches. The
  // fused path's weight gradients only with `weight_grads` (else the caller runs them).
  // With `shared` the window's fused launch also runs the shared expert's dgrad and dx tiles.
  void routed_backward(const std::vector<MoEBackwardArgs>& ranks, const MoEContext& context, int window,
                       bool recompute_up_gate, bool weight_grads, bool shared, comm::World& world,
                       cudaStream_t stream);
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
    // The shared expert's rows padded to 128 with zeros: its own copy of x (else it reads io.x).
    if (rank.shared.x != rank.io.x) {
      copy_unless_same(rank.local.buffers().shared_x, a.x, rows, stream, "MoELayer: cudaMemcpyAsync(shared x)");
    }
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
  exchange->build_schedule(router, stream);
  if (fused) return;
  exchange->dispatch(stream);
  for (size_t l = 0; l < args.size(); ++l) {
    gemm::expert_up_gate(ranks[l].routed, {args[l].weights.w_gate_up, args[l].weights.w_down}, stream);
  }
}

void MoELayer::Impl::routed_backward(const std::vector<MoEBackwardArgs>& args, const MoEContext& context, int window,
                                     bool recompute_up_gate, bool weight_grads, bool shared, comm::World& world,
                                     cudaStream_t stream) {
  const auto [first_row, end_row] = window_rows(window);
  // The ring's x rows of the window: the weight gradients read every row's x there, and so does
  // its up/gate replay. After the fused forward (no replay), macrobatch 0's rows of tokens on
  // other GPUs (all rows, with pull_all_rows) are still in the ring where its pull put them: only
  // the rows it read in place are copied, no row crosses NVLink again.
  const transfer::RowsInPlace x_in_place = recompute_up_gate ? transfer::RowsInPlace::kNone
                                           : pull_all_rows  ? transfer::RowsInPlace::kAll
                                                            : transfer::RowsInPlace::kOtherGpus;
  // The fused backward's launch pulls the x rows itself unless the up/gate replay needs them first.
  const bool x_in_fused_launch = fused && fused_backward && !recompute_up_gate;
  if (fused && !x_in_fused_launch) {
    transfer::PullRange x_rows{first_row, end_row};
    x_rows.in_place = x_in_place;
    // The pass's first pull has the world barrier after every rank staged dy; the others need none
    // (they write this rank's ring only, and the reverse dispatch's barrier ends the pass).
    x_rows.after_barrier = window > 0;
    exchange->dispatch(stream, x_rows);
    for (size_t l = 0; l < args.size() && recompute_up_gate; ++l) {
      const MoEWeights& w = context.ranks_[l].weights;
      gemm::expert_up_gate(window_pass(l, window), {w.w_gate_up, w.w_down}, stream);
    }
  }
  if (fused && fused_backward) {
    // The rows of tokens on this GPU copied into the ring on every SM (the pass's world barrier for
    // window 0 if the x dispatch had none); those of other GPUs pulled, the dgrad+SwiGLU and dx tiles
    // (rows stored home) run in one launch; the weight gradients after it, x's and dy's last read.
    transfer::PullRange dy_rows{first_row, end_row};
    dy_rows.in_place =
        pull_all_rows || local_rows_in_launch ? transfer::RowsInPlace::kAll : transfer::RowsInPlace::kOtherGpus;
    dy_rows.after_barrier = window > 0 || !x_in_fused_launch;
    exchange->reverse_combine(stream, dy_rows);
    fused::FusedBackwardArgs launch;
    launch.exchange = exchange.get();
    launch.comm_ctas = fused_comm_ctas;
    launch.pull_x = x_in_fused_launch;
    launch.x_in_place = x_in_place;
    launch.pull_all_rows = pull_all_rows;
    launch.local_rows_in_launch = local_rows_in_launch;
    for (size_t l = 0; l < args.size(); ++l) {
      const MoEWeights& w = context.ranks_[l].weights;
      fused::FusedBackwardRank rank;
      rank.pass = window_pass(l, window);
      rank.weights = {w.w_gate_up, w.w_down};
      rank.ready_counters = ranks[l].local.buffers().ready_counters;
      rank.has_shared = shared;
      rank.shared = ranks[l].shared;
      rank.shared_weights = {w.shared_w_gate_up, w.shared_w_down};
      // Its dx straight into the exchange's slot, a row per token (not in place over its x rows).
      rank.shared.dx = ranks[l].shared_dx_slot;
      rank.shared_dx_rows = sizes.tokens;
      launch.ranks.push_back(rank);
    }
    fused::fused_backward(world, launch, stream);
    for (size_t l = 0; l < args.size() && weight_grads; ++l) {
      gemm::expert_weight_grads(window_pass(l, window), window_gradients(args[l], l, window), stream);
    }
    return;
  }
  transfer::PullRange dy_rows{first_row, end_row};
  dy_rows.after_barrier = fused;  // v1's backward pulls nothing before (its replay's dispatch precedes dy)
  exchange->reverse_combine(stream, dy_rows);
  for (size_t l = 0; l < args.size(); ++l) {
    const MoEWeights& w = context.ranks_[l].weights;
    const gemm::ExpertPass pass = window_pass(l, window);
    gemm::expert_backward_before_dx(pass, {w.w_gate_up, w.w_down}, window_gradients(args[l], l, window), stream);
    // dx rows straight into their home slots (reverse dispatch's push in the GEMM's epilogue).
    fused::gate_up_dgrad_to_home(world, *exchange, static_cast<int>(l), pass, {w.w_gate_up, w.w_down}, stream);
  }
}

MoELayerMemory MoELayer::memory(const LayerConfig& config, const MoELayerOptions& options, int multiprocessors) {
  CARACAL_CHECK(multiprocessors >= 0, "MoELayer::memory: multiprocessors must be >= 0 (0: the current device's), got ",
                multiprocessors);
  if (multiprocessors == 0) multiprocessors = current_device_multiprocessors();
  return layer::layer_memory(config, options, multiprocessors);
}

MoELayer::MoELayer(const LayerConfig& config, comm::World& world, const MoELayerOptions& options)
    : config_(config), world_(world), impl_(std::make_unique<Impl>()) {
  // First, before anything can throw on some ranks only: every rank must hold the same
  // configuration and heap-shaping options (collective).
  require_same_config(config, options, world);
  Impl& state = *impl_;
  state.sizes = layer::layer_sizes(config, options, world.multiprocessors());
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
  const size_t heap = memory(config, options, world.multiprocessors()).heap;
  CARACAL_CHECK(heap <= world.heap_bytes_left(), "MoELayer: needs ", heap,
                " bytes of symmetric heap per rank (MoELayer::heap_bytes(config, options)), but the world has ",
                world.heap_bytes_left(), " left");
  state.fused = layer::runs_fused(config, options);
  transfer::ExchangeOptions exchange =
      layer::exchange_options(config, state.sizes, state.fused, layer::sums_dx_per_token_rank(config, options));
  exchange.max_sms = options.exchange_sms;
  exchange.rows_per_route = options.rows_per_route;
  state.exchange = std::make_unique<transfer::TokenExchange>(world, layer::exchange_shape(config), exchange);
  if (state.fused) {
    const int ctas = fused::fused_ctas_per_rank(world);
    CARACAL_CHECK(options.fused_comm_ctas >= 0 && options.fused_comm_ctas < ctas,
                  "MoELayer: options.fused_comm_ctas must be in [0, ", ctas - 1, "] (0: ",
                  fused::default_comm_ctas(world), " on this device), got ", options.fused_comm_ctas);
    state.fused_comm_ctas = options.fused_comm_ctas;
    state.fused_backward = options.fused_backward;
    state.dx_sums_in_weight_grads = options.dx_sums_in_weight_grads;
    state.pull_all_rows = options.fused_pull_all_rows;
    state.local_rows_in_launch = options.fused_backward_local_rows_in_launch;
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

int MoELayer::ring_rows() const { return impl_->fused ? impl_->sizes.ring_rows : 0; }

bool MoELayer::groups_dx_rows() const { return impl_->dx_slots() == transfer::DxSlots::kPerTokenRank; }

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
  if (!state.fused) {
    for (size_t l = 0; l < ranks.size(); ++l) {
      if (!sizes.has_shared) break;
      gemm::expert_forward(state.ranks[l].shared, {ranks[l].weights.shared_w_gate_up, ranks[l].weights.shared_w_down},
                           stream);
    }
  }
  fused::FusedForwardArgs fused_args;
  if (state.fused) {
    fused_args.exchange = state.exchange.get();
    fused_args.router = config_.router;
    fused_args.comm_ctas = state.fused_comm_ctas;
    fused_args.pull_all_rows = state.pull_all_rows;
    for (size_t l = 0; l < ranks.size(); ++l) {
      const MoEWeights& w = ranks[l].weights;
      const RankState& rank_state = state.ranks[l];
      fused_args.ranks.push_back({rank_state.routed, {w.w_gate_up, w.w_down}, sizes.has_shared, rank_state.shared,
                                  {w.shared_w_gate_up, w.shared_w_down}, rank_state.local.buffers().ready_counters});
    }
    fused::zero_ready_counters(fused_args, stream);
  }
  state.exchange->build_schedule(config_.router, stream);
  if (state.fused) {
    fused::fused_forward(world_, fused_args, stream);  // right after the schedule: it starts early
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
    if (ranks[l].shared_scale != nullptr) {  // in place when shared.out is the slot
      layer::scale_rows(rank_state.shared.out, rank_state.shared.gates, sizes.tokens, sizes.hidden,
                        rank_state.shared_out_slot, stream);
    } else {
      copy_unless_same(rank_state.shared_out_slot, rank_state.shared.out, rows, stream,
                       "MoELayer::forward: cudaMemcpyAsync(shared out)");
    }
  }
  // combine writes y into the caller's buffers (up to kMaxCombineOutputs local ranks; more get a copy).
  std::vector<bf16*> y;
  if (world_.local_ranks() <= transfer::kMaxCombineOutputs) {
    for (const MoEForwardArgs& rank : ranks) y.push_back(rank.y);
  }
  if (state.fused) {
    // The fused kernel pushed the sums of the macrobatches before the last; macrobatch 0's wait in
    // expert_dy's ring rows.
    state.exchange->combine_after_fused_forward(config_.router, sizes.ring_rows, stream, y);
  } else {
    state.exchange->combine(config_.router, stream, 0, y);
  }
  std::vector<layer::PoisonSpan> outputs;
  for (size_t l = 0; l < ranks.size(); ++l) {
    if (y.empty()) {
      copy_unless_same(ranks[l].y, state.ranks[l].io.y, rows, stream, "MoELayer::forward: cudaMemcpyAsync(y)");
    }
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
    CARACAL_CHECK(!state.fused || !sizes.has_ring_past_rows() || sizes.weight_grad_partials ||
                      (ranks[i].d_w_gate_up_bf16 == nullptr && ranks[i].d_w_down_bf16 == nullptr),
                  kBackward, ": ranks[", l,
                  "] asks for bf16 routed weight gradients, but the layer was built with "
                  "MoELayerOptions::bf16_weight_gradients = false (no partial sums to carry them across its ring's "
                  "macrobatches): give d_w_gate_up / d_w_down in fp32, or build the layer with it true");
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
    if (sizes.has_shared && rank_state.shared.dy != rank_state.io.dy) {  // padded to 128 rows with zeros
      copy_unless_same(rank_state.local.buffers().shared_dy, ranks[l].dy, rows, stream,
                       "MoELayer::backward: cudaMemcpyAsync(shared dy)");
    }
  }

  // The routed experts' backward over the ring, macrobatch by macrobatch from the first (the
  // fused forward left macrobatch 0 in it; the others, and all after a replay, get their up/gate
  // tiles again); v1 in one pass over its buffers of every row. The host never learns the rows,
  // so it walks every macrobatch the schedule can have; those past its rows launch no work.
  const int windows = state.fused ? (sizes.routed_rows + sizes.ring_rows - 1) / sizes.ring_rows : 1;
  // In a world of one rank the reverse dispatch's sums ride on the last macrobatch's weight
  // gradients, which then wait for the shared expert's dx below.
  const bool dx_sums_ride = state.dx_sums_ride(world_) && windows > 0;
  // The fused backward runs the shared expert's dgrad and dx tiles in macrobatch 0's launch.
  const bool shared_in_fused_launch = state.fused && state.fused_backward && sizes.has_shared && windows > 0;
  for (int window = 0; window < windows; ++window) {
    const bool weight_grads = !dx_sums_ride || window + 1 < windows;
    state.routed_backward(ranks, context, window, replay || window > 0, weight_grads,
                          shared_in_fused_launch && window == 0, world_, stream);
  }
  for (size_t l = 0; l < ranks.size(); ++l) {
    const MoEBackwardArgs& a = ranks[l];
    const MoEWeights& w = context.ranks_[l].weights;
    RankState& rank_state = state.ranks[l];
    if (!sizes.has_shared) continue;
    const gemm::ExpertPassGradients shared_grads{a.d_shared_w_gate_up, a.d_shared_w_down, a.d_shared_w_gate_up_bf16,
                                                 a.d_shared_w_down_bf16};
    if (shared_in_fused_launch) {  // its dx already in the slot
      gemm::expert_weight_grads(rank_state.shared, shared_grads, stream);
    } else {
      gemm::expert_backward(rank_state.shared, {w.shared_w_gate_up, w.shared_w_down}, shared_grads, stream);
      copy_unless_same(rank_state.shared_dx_slot, rank_state.shared.dx, rows, stream,
                       "MoELayer::backward: cudaMemcpyAsync(shared dx)");
    }
    if (a.d_shared_scale != nullptr) {
      copy_unless_same(a.d_shared_scale, rank_state.shared.dg, sizes.tokens, stream,
                       "MoELayer::backward: cudaMemcpyAsync(d_shared_scale)");
    }
  }
  if (dx_sums_ride) {
    const size_t l = 0;  // a world of one rank
    fused::weight_grads_with_dx_sums(world_, *state.exchange, config_.router, state.window_pass(l, windows - 1),
                                     state.window_gradients(ranks[l], l, windows - 1), stream);
  } else {
    state.exchange->reverse_dispatch_filled_dx_slots(config_.router, stream, state.dx_slots());
  }
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
