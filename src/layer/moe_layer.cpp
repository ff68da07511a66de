// MoELayer: the arguments checked, the inputs and dy staged, the outputs copied out and poisoned
// after a failed wait; the passes in between are its plan's (layer/layer_plan.hpp), v1's or the
// fused one, chosen at construction.
#include "caracal/moe_layer.hpp"

#include <cuda_runtime.h>

#include <string>
#include <utility>
#include <vector>

#include "caracal/error.hpp"
#include "fused/fused_forward.hpp"
#include "caracal/gemm/expert_pass_fp8.hpp"
#include "layer/argument_checks.hpp"
#include "layer/device_checks.hpp"
#include "layer/fp8_weights.hpp"
#include "layer/layer_experiments.hpp"
#include "layer/layer_plan.hpp"
#include "layer/layer_sizes.hpp"
#include "layer/layer_state.hpp"
#include "layer/poison_outputs.hpp"
#include "layer/shared_rows.hpp"

namespace caracal {

namespace {

using bf16 = __nv_bfloat16;
using layer::copy_unless_same;
constexpr const char* kForward = "MoELayer::forward";
constexpr const char* kBackward = "MoELayer::backward";

// Throws caracal::Error on every rank unless all ranks of `world` hold the same configuration and
// options as far as the heap and the rows between ranks go (layer::values_ranks_agree_on;
// collective: before anything else, so that no rank throws alone and leaves the others waiting).
void require_same_config(const LayerConfig& config, const MoELayerOptions& options,
                         const layer::LayerExperiments& experiments, comm::World& world) {
  std::vector<const char*> names;
  std::vector<int64_t> values;
  for (const layer::AgreedValue& v :
       layer::values_ranks_agree_on(config, options, experiments, world.multiprocessors())) {
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

}  // namespace

struct MoELayer::Impl {
  layer::LayerState state;
  std::unique_ptr<layer::LayerPlan> plan;
  bool fused = false;
};

MoELayerMemory MoELayer::memory(const LayerConfig& config, const MoELayerOptions& options, int multiprocessors) {
  return layer::ExperimentalLayer::memory(config, options, {}, multiprocessors);
}

namespace layer {

MoELayerMemory ExperimentalLayer::memory(const LayerConfig& config, const MoELayerOptions& options,
                                         const LayerExperiments& experiments, int multiprocessors) {
  CARACAL_CHECK(multiprocessors >= 0, "MoELayer::memory: multiprocessors must be >= 0 (0: the current device's), got ",
                multiprocessors);
  if (multiprocessors == 0) multiprocessors = current_device_multiprocessors();
  return layer_memory(config, options, experiments, multiprocessors);
}

std::unique_ptr<MoELayer> ExperimentalLayer::make(const LayerConfig& config, comm::World& world,
                                                  const MoELayerOptions& options, const LayerExperiments& experiments) {
  return std::unique_ptr<MoELayer>(new MoELayer(config, world, options, experiments));
}

}  // namespace layer

MoELayer::MoELayer(const LayerConfig& config, comm::World& world, const MoELayerOptions& options)
    : MoELayer(config, world, options, layer::LayerExperiments{}) {}

MoELayer::MoELayer(const LayerConfig& config, comm::World& world, const MoELayerOptions& options,
                   const layer::LayerExperiments& experiments)
    : config_(config), world_(world), impl_(std::make_unique<Impl>()) {
  // First, before anything can throw on some ranks only: every rank must hold the same
  // configuration and heap-shaping options (collective).
  require_same_config(config, options, experiments, world);
  layer::LayerState& state = impl_->state;
  state.config = config;
  state.experiments = experiments;
  state.sizes = layer::layer_sizes(config, options, world.multiprocessors());
  // The FP8 experiments' switches leave a bf16 layer as it is.
  const bool fused_fp8_backward = experiments.fused_fp8_backward && state.sizes.fp8;
  CARACAL_CHECK(!fused_fp8_backward || state.sizes.fp8_weight_grads,
                "MoELayer: the fused FP8 backward needs FP8 weight gradients (options.fp8_weight_gradients)");
  CARACAL_CHECK(!fused_fp8_backward || world.local_ranks() <= fused::kFusedFp8MaxLocalRanks,
                "MoELayer: the fused FP8 backward drives at most ", fused::kFusedFp8MaxLocalRanks,
                " local ranks (its kernel's parameters), got ", world.local_ranks());
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
  const size_t heap = layer::ExperimentalLayer::memory(config, options, experiments, world.multiprocessors()).heap;
  CARACAL_CHECK(heap <= world.heap_bytes_left(), "MoELayer: needs ", heap,
                " bytes of symmetric heap per rank (MoELayer::heap_bytes(config, options)), but the world has ",
                world.heap_bytes_left(), " left");
  impl_->fused = layer::runs_fused(config, options);
  if (impl_->fused) {
    const int ctas = fused::fused_ctas_per_rank(world);
    CARACAL_CHECK(options.fused_comm_ctas >= 0 && options.fused_comm_ctas < ctas,
                  "MoELayer: options.fused_comm_ctas must be in [0, ", ctas - 1, "] (0: ",
                  fused::default_comm_ctas(world), " on this device), got ", options.fused_comm_ctas);
  }
  state.exchange = std::make_unique<transfer::TokenExchange>(
      world, layer::exchange_shape(config), layer::exchange_options(config, options, experiments, state.sizes));
  state.ranks.reserve(static_cast<size_t>(world.local_ranks()));
  for (int l = 0; l < world.local_ranks(); ++l) {
    state.ranks.push_back(layer::make_rank_state(state.sizes, *state.exchange, world, l, options));
  }
  impl_->plan = state.sizes.fp8  ? layer::make_fp8_launches_plan(state, world)
                : impl_->fused   ? layer::make_fused_plan(state, world, options.fused_comm_ctas)
                                 : layer::make_separate_launches_plan(state, world);
}

MoELayer::~MoELayer() = default;

MoELayerBuffers MoELayer::buffers(int local_rank) const {
  CARACAL_CHECK(local_rank >= 0 && local_rank < world_.local_ranks(), "MoELayer::buffers: local_rank must be in [0, ",
                world_.local_ranks(), "), got ", local_rank);
  return impl_->state.ranks[static_cast<size_t>(local_rank)].io;
}

int MoELayer::ring_rows() const { return impl_->plan->ring_rows(); }

bool MoELayer::groups_dx_rows() const { return impl_->plan->dx_slots() == transfer::DxSlots::kPerTokenRank; }

size_t MoELayer::fp8_weight_bytes() const {
  const layer::LayerSizes& s = impl_->state.sizes;
  CARACAL_CHECK(s.fp8, "MoELayer::fp8_weight_bytes: the layer is bf16 (LayerConfig::precision kFP8 quantizes weights)");
  return layer::fp8_layer_weight_bytes(s);
}

void MoELayer::quantize_weights(const MoEWeights& weights, void* w_fp8, cudaStream_t stream) const {
  constexpr const char* kQuantize = "MoELayer::quantize_weights";
  const layer::LayerSizes& s = impl_->state.sizes;
  CARACAL_CHECK(s.fp8, kQuantize, ": the layer is bf16 (LayerConfig::precision kFP8 quantizes weights)");
  layer::check_current_device(world_.device(), kQuantize);
  CARACAL_CHECK(weights.w_gate_up_layout == gemm::GateUpLayout::kInterleaved, kQuantize,
                ": weights.w_gate_up_layout must be interleaved (the FP8 GEMMs' order), got the [gate; up] halves");
  const int L = s.local_experts, D = s.hidden, I = s.intermediate;
  const auto aligned = [](const void* p, uintptr_t alignment) {
    return p != nullptr && reinterpret_cast<uintptr_t>(p) % alignment == 0;
  };
  CARACAL_CHECK(aligned(weights.w_gate_up, 16), kQuantize, ": weights.w_gate_up must be a 16-byte aligned device pointer to [L=",
                L, "][2I=", 2 * I, "][D=", D, "] bf16, got ", weights.w_gate_up);
  CARACAL_CHECK(aligned(weights.w_down, 16), kQuantize, ": weights.w_down must be a 16-byte aligned device pointer to [L=", L,
                "][D=", D, "][I=", I, "] bf16, got ", weights.w_down);
  const int Is = s.shared_intermediate;
  if (s.has_shared) {
    CARACAL_CHECK(aligned(weights.shared_w_gate_up, 16), kQuantize,
                  ": weights.shared_w_gate_up must be a 16-byte aligned device pointer to [2Is=", 2 * Is, "][D=", D,
                  "] bf16 (the layer has a shared expert), got ", weights.shared_w_gate_up);
    CARACAL_CHECK(aligned(weights.shared_w_down, 16), kQuantize,
                  ": weights.shared_w_down must be a 16-byte aligned device pointer to [D=", D, "][Is=", Is,
                  "] bf16 (the layer has a shared expert), got ", weights.shared_w_down);
  }
  CARACAL_CHECK(aligned(w_fp8, 256), kQuantize, ": w_fp8 must be a 256-byte aligned device pointer to ",
                fp8_weight_bytes(), " bytes (MoELayer::fp8_weight_bytes), got ", w_fp8);
  const layer::RelaxedCaptureScope relaxed;  // pointer queries inside a caller's capture
  std::vector<std::pair<const void*, const char*>> pointers{
      {weights.w_gate_up, "weights.w_gate_up"}, {weights.w_down, "weights.w_down"}, {w_fp8, "w_fp8"}};
  if (s.has_shared) {
    pointers.push_back({weights.shared_w_gate_up, "weights.shared_w_gate_up"});
    pointers.push_back({weights.shared_w_down, "weights.shared_w_down"});
  }
  for (const auto& [p, name] : pointers) {
    cudaPointerAttributes a{};
    const cudaError_t err = cudaPointerGetAttributes(&a, p);
    if (err != cudaSuccess) (void)cudaGetLastError();  // not sticky: cleared for later calls
    const bool on_device = err == cudaSuccess && (a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged);
    CARACAL_CHECK(on_device && (a.type == cudaMemoryTypeManaged || a.device == world_.device()), kQuantize, ": ", name,
                  " must point to device memory of device ", world_.device(), ", got ", p);
  }
  layer::quantize_layer_weights(weights, s, layer::fp8_layer_weight_buffers(w_fp8, s), stream);
}

void MoELayer::check() { impl_->state.exchange->check(); }

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
    const std::vector<layer::PointerArg> args = layer::forward_pointer_args(ranks[i], impl_->state.sizes, false);
    layer::check_pointer_args(args, kContext, l);
    layer::check_gate_up_layout(ranks[i].weights, kContext, l);
    layer::check_pointer_devices(args, impl_->state.ranks[i].owned(), world_.device(), kContext, l);
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
  layer::LayerState& state = impl_->state;
  const layer::LayerSizes& sizes = state.sizes;
  const layer::RelaxedCaptureScope relaxed;
  layer::check_current_device(world_.device(), kForward);
  world_.check();  // a faulted world refuses work until reset()
  layer::check_rank_count(ranks.size(), world_.local_ranks(), kForward);
  for (int l = 0; l < world_.local_ranks(); ++l) {
    const std::vector<layer::PointerArg> args = layer::forward_pointer_args(ranks[static_cast<size_t>(l)], sizes);
    layer::check_pointer_args(args, kForward, l);
    layer::check_gate_up_layout(ranks[static_cast<size_t>(l)].weights, kForward, l);
    layer::check_pointer_devices(args, state.ranks[static_cast<size_t>(l)].owned(), world_.device(), kForward, l);
  }

  const int64_t rows = static_cast<int64_t>(sizes.tokens) * sizes.hidden;
  layer::stage_inputs(state, ranks, stream);
  impl_->plan->forward(ranks, stream);
  // The shared expert's rows into combine's input: scaled by c_t, or as they are.
  for (size_t l = 0; l < ranks.size(); ++l) {
    const layer::RankState& rank_state = state.ranks[l];
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
  impl_->plan->combine(y, stream);
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
  layer::LayerState& state = impl_->state;
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
    CARACAL_CHECK(!impl_->fused || !sizes.has_ring_past_rows() || sizes.weight_grad_partials ||
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
    impl_->plan->replay(context.ranks_, stream);
    held_forward_ = context.forward_id_;
  }

  const int64_t rows = static_cast<int64_t>(sizes.tokens) * sizes.hidden;
  const int64_t routes = static_cast<int64_t>(sizes.tokens) * sizes.top_k;
  for (size_t l = 0; l < ranks.size(); ++l) {
    const layer::RankState& rank_state = state.ranks[l];
    copy_unless_same(rank_state.io.dy, ranks[l].dy, rows, stream, "MoELayer::backward: cudaMemcpyAsync(dy)");
    if (sizes.has_shared && rank_state.shared.dy != rank_state.io.dy) {  // padded to 128 rows with zeros
      copy_unless_same(rank_state.local.buffers().shared_dy, ranks[l].dy, rows, stream,
                       "MoELayer::backward: cudaMemcpyAsync(shared dy)");
    }
  }

  impl_->plan->backward(ranks, context.ranks_, replay, stream);
  std::vector<layer::PoisonSpan> outputs;
  for (size_t l = 0; l < ranks.size(); ++l) {
    const layer::RankState& rank_state = state.ranks[l];
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
