// The PyTorch operators of python/caracal (namespace `caracal`), over MoELayer. Setup ops
// (create_layer, destroy_layer, ...) run eagerly; moe_forward and moe_backward are the traced
// ops, whose fake implementations and autograd formula live in python/caracal/_ops.py.
//
// Tensors of every local rank are stacked along dim 0: with R local ranks (R = ep_size for the
// loopback world, 1 for NCCL) x is [R*T, D] and the routed weights are [R*L, ...]; the one shared
// expert is used by every local rank and its gradient is summed over them. Weights are bf16 or
// fp32 (cast to bf16 for the kernels); their gradients come back in their own dtype.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "caracal/error.hpp"
#include "torch_ext/torch_layer.hpp"

namespace caracal::torch_ext {

namespace {

using at::Tensor;
using bf16 = __nv_bfloat16;

// Runs `body`, turning caracal::Error (CUDA/NCCL failures, device-side errors, the layer's own
// argument checks) into c10::Error, which Python raises as RuntimeError.
template <typename Body>
auto translate_errors(const char* op, Body&& body) {
  try {
    return body();
  } catch (const Error& e) {
    TORCH_CHECK(false, "caracal.", op, ": ", e.what());
  }
}

// Checks one tensor argument: CUDA on `device`, `dtype`, contiguous, exactly `sizes`.
void check_tensor(const char* op, const char* name, const Tensor& t, int device, at::ScalarType dtype,
                  at::IntArrayRef sizes) {
  TORCH_CHECK_VALUE(t.defined(), "caracal.", op, ": ", name, " is missing");
  TORCH_CHECK_VALUE(t.is_cuda() && t.get_device() == device, "caracal.", op, ": ", name, " must be on cuda:", device,
                    ", got ", t.device());
  TORCH_CHECK_TYPE(t.scalar_type() == dtype, "caracal.", op, ": ", name, " must be ", dtype, ", got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.sizes() == sizes, "caracal.", op, ": ", name, " must have shape ", sizes, ", got ", t.sizes());
  TORCH_CHECK_VALUE(t.is_contiguous(), "caracal.", op, ": ", name, " must be contiguous");
  TORCH_CHECK_VALUE(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0, "caracal.", op, ": ", name,
                    " must be 16-byte aligned (a view at an odd offset is not)");
}

template <typename T>
T* ptr(const Tensor& t, int64_t offset = 0) {
  return reinterpret_cast<T*>(t.data_ptr()) + offset;
}

// Layer sizes as the ops use them.
struct Dims {
  int64_t ranks, tokens, top_k, hidden, inter, local_experts, shared_inter;
  bool has_shared;
  gemm::GateUpLayout gate_up_layout;  // of w_gate_up (TorchLayer::gate_up_layout)
};

Dims dims_of(const TorchLayer& l) {
  const LayerConfig& c = l.config;
  return Dims{l.world->local_ranks(), c.tokens_per_rank,     c.shape.top_k,
              c.shape.hidden,         c.shape.intermediate,  c.local_experts(),
              c.shape.shared_intermediate, c.shape.num_shared_experts > 0, l.gate_up_layout};
}

// The weights: bf16, or fp32 (cast to bf16 for the kernels); all four of one dtype, which is
// also the dtype of their gradients.
void check_weights(const char* op, const TorchLayer& l, const Dims& d, const Tensor& w_gate_up, const Tensor& w_down,
                   const std::optional<Tensor>& shared_w_gate_up, const std::optional<Tensor>& shared_w_down) {
  const int64_t experts = d.ranks * d.local_experts;
  const at::ScalarType dtype = w_gate_up.scalar_type();
  TORCH_CHECK_TYPE(dtype == at::kBFloat16 || dtype == at::kFloat, "caracal.", op,
                   ": w_gate_up must be torch.bfloat16 or torch.float32, got ", dtype);
  check_tensor(op, "w_gate_up", w_gate_up, l.device, dtype, {experts, 2 * d.inter, d.hidden});
  check_tensor(op, "w_down", w_down, l.device, dtype, {experts, d.hidden, d.inter});
  if (!d.has_shared) {
    TORCH_CHECK_VALUE(!shared_w_gate_up && !shared_w_down, "caracal.", op,
                      ": the layer has no shared expert: shared_w_gate_up and shared_w_down must be None");
    return;
  }
  TORCH_CHECK_VALUE(shared_w_gate_up && shared_w_down, "caracal.", op,
                    ": the layer has a shared expert: shared_w_gate_up and shared_w_down are required");
  check_tensor(op, "shared_w_gate_up", *shared_w_gate_up, l.device, dtype, {2 * d.shared_inter, d.hidden});
  check_tensor(op, "shared_w_down", *shared_w_down, l.device, dtype, {d.hidden, d.shared_inter});
}

// The weights as the kernels read them: [w_gate_up, w_down, shared_w_gate_up, shared_w_down]
// (undefined without a shared expert), bf16.
std::vector<Tensor> kernel_weights(const Tensor& w_gate_up, const Tensor& w_down,
                                   const std::optional<Tensor>& shared_w_gate_up,
                                   const std::optional<Tensor>& shared_w_down) {
  const auto to_bf16 = [](const Tensor& w) { return w.to(at::kBFloat16).contiguous(); };
  return {to_bf16(w_gate_up), to_bf16(w_down), shared_w_gate_up ? to_bf16(*shared_w_gate_up) : Tensor(),
          shared_w_down ? to_bf16(*shared_w_down) : Tensor()};
}

// FP8 layers: the expert weights of every local rank quantized by quantize_weights, uint8
// [local ranks][MoELayer::fp8_weight_bytes()] (rows 256-byte aligned); checked by check_w_fp8.
MoEWeights rank_weights(const Dims& d, int64_t r, const std::vector<Tensor>& kernel,
                        const std::optional<Tensor>& w_fp8) {
  MoEWeights w;
  if (w_fp8) w.w_fp8 = ptr<const uint8_t>(*w_fp8, r * w_fp8->size(1));
  w.w_gate_up = ptr<const bf16>(kernel[0], r * d.local_experts * 2 * d.inter * d.hidden);
  w.w_down = ptr<const bf16>(kernel[1], r * d.local_experts * d.hidden * d.inter);
  w.w_gate_up_layout = d.gate_up_layout;
  if (d.has_shared) {
    w.shared_w_gate_up = ptr<const bf16>(kernel[2]);
    w.shared_w_down = ptr<const bf16>(kernel[3]);
  }
  return w;
}

// ---- Setup ops ----------------------------------------------------------------------------------

Tensor nccl_unique_id() {
  return translate_errors("nccl_unique_id", [] {
    comm::require_nccl_environment();
    const ncclUniqueId id = comm::new_unique_id();
    Tensor out = at::empty({static_cast<int64_t>(sizeof(id.internal))}, at::kByte);
    std::memcpy(out.data_ptr(), id.internal, sizeof(id.internal));
    return out;
  });
}

int64_t create_layer(int64_t hidden, int64_t intermediate, int64_t num_experts, int64_t top_k,
                     int64_t shared_intermediate, int64_t ep_size, int64_t tokens_per_rank, bool normalize,
                     double router_scale, const std::string& backend, int64_t rank,
                     const std::optional<Tensor>& unique_id, int64_t device, int64_t gemm_ctas, int64_t exchange_sms,
                     bool fused_forward, int64_t ring_rows, bool bf16_weight_gradients, double timeout_s,
                     const std::string& gate_up_layout, const std::string& precision, bool fp8_weight_gradients) {
  TorchLayerSpec spec;
  LayerShape& s = spec.config.shape;
  s.hidden = hidden;
  s.intermediate = intermediate;
  s.num_experts = num_experts;
  s.top_k = top_k;
  s.num_shared_experts = shared_intermediate > 0 ? 1 : 0;
  s.shared_intermediate = shared_intermediate;
  spec.config.ep_size = ep_size;
  spec.config.tokens_per_rank = tokens_per_rank;
  spec.config.router = RouterNormalization{normalize, router_scale};
  TORCH_CHECK_VALUE(backend == "loopback" || backend == "nccl",
                    "caracal.create_layer: backend must be 'loopback' or 'nccl', got '", backend, "'");
  spec.backend = backend == "nccl" ? Backend::kNccl : Backend::kLoopback;
  // The C++ side takes these as int: refuse what would not fit instead of narrowing it.
  constexpr int64_t kIntMax = std::numeric_limits<int>::max();
  TORCH_CHECK_VALUE(ep_size >= 1 && ep_size <= kIntMax, "caracal.create_layer: ep_size must be in [1, ", kIntMax,
                    "], got ", ep_size);
  TORCH_CHECK_VALUE(rank >= 0 && rank < ep_size, "caracal.create_layer: rank must be in [0, ep_size = ", ep_size,
                    "), got ", rank);
  TORCH_CHECK_VALUE(device >= 0 && device <= kIntMax, "caracal.create_layer: device must be a CUDA device index >= 0, got ",
                    device);
  TORCH_CHECK_VALUE(gemm_ctas >= 0 && gemm_ctas <= kIntMax, "caracal.create_layer: gemm_ctas must be in [0, ", kIntMax,
                    "] (0: the default), got ", gemm_ctas);
  TORCH_CHECK_VALUE(exchange_sms >= 0 && exchange_sms <= kIntMax, "caracal.create_layer: exchange_sms must be in [0, ",
                    kIntMax, "] (0: the default), got ", exchange_sms);
  spec.rank = static_cast<int>(rank);
  spec.device = static_cast<int>(device);
  spec.gemm_ctas = static_cast<int>(gemm_ctas);
  spec.exchange_sms = static_cast<int>(exchange_sms);
  spec.fused_forward = fused_forward;
  TORCH_CHECK_VALUE(ring_rows >= 0 && ring_rows <= std::numeric_limits<int>::max(),
                    "caracal.create_layer: ring_rows must be 0 (default) or a positive multiple of 128, got ", ring_rows);
  spec.ring_rows = static_cast<int>(ring_rows);
  spec.bf16_weight_gradients = bf16_weight_gradients;
  spec.fp8_weight_gradients = fp8_weight_gradients;
  TORCH_CHECK_VALUE(timeout_s > 0.0 && timeout_s <= 3600.0,
                    "caracal.create_layer: timeout must be in (0, 3600] seconds, got ", timeout_s);
  spec.timeout_s = timeout_s;
  TORCH_CHECK_VALUE(gate_up_layout == "interleaved" || gate_up_layout == "halves",
                    "caracal.create_layer: gate_up_layout must be 'interleaved' or 'halves', got '", gate_up_layout,
                    "'");
  spec.gate_up_layout = gate_up_layout == "halves" ? gemm::GateUpLayout::kHalves : gemm::GateUpLayout::kInterleaved;
  TORCH_CHECK_VALUE(precision == "bf16" || precision == "fp8", "caracal.create_layer: precision must be 'bf16' or 'fp8', got '",
                    precision, "'");
  spec.config.precision = precision == "fp8" ? Precision::kFP8 : Precision::kBF16;
  // The FP8 GEMMs read W_gate_up interleaved (MoELayer refuses the halves at forward; here, at once).
  TORCH_CHECK_VALUE(precision != "fp8" || spec.gate_up_layout == gemm::GateUpLayout::kInterleaved,
                    "caracal.create_layer: precision 'fp8' needs gate_up_layout 'interleaved', got 'halves'");
  if (spec.backend == Backend::kNccl) {
    TORCH_CHECK_VALUE(unique_id && unique_id->scalar_type() == at::kByte && unique_id->device().is_cpu() &&
                          unique_id->numel() == NCCL_UNIQUE_ID_BYTES,
                      "caracal.create_layer: the NCCL backend needs unique_id, a CPU uint8 tensor of ",
                      NCCL_UNIQUE_ID_BYTES, " bytes (from caracal.nccl_unique_id)");
    ncclUniqueId id;
    std::memcpy(id.internal, unique_id->contiguous().data_ptr(), sizeof(id.internal));
    spec.unique_id = id;
  }
  try {
    spec.config.validate();
  } catch (const Error& e) {
    TORCH_CHECK_VALUE(false, "caracal.create_layer: ", e.what());
  }
  return translate_errors("create_layer", [&] { return register_layer(std::make_shared<TorchLayer>(spec)); });
}

void destroy_layer(int64_t handle) { unregister_layer(handle); }

// How many holders besides the registry keep the layer alive (the tensors fault_flag gave): an NCCL
// layer is torn down collectively only once it is 0 on every rank (caracal.World.close).
int64_t layer_holders(int64_t handle) { return static_cast<int64_t>(find_layer(handle).use_count()) - 2; }

// [heap bytes per rank, local bytes per local rank] the layer took.
std::vector<int64_t> layer_memory(int64_t handle) {
  const auto l = find_layer(handle);
  return {static_cast<int64_t>(l->memory.heap), static_cast<int64_t>(l->memory.local)};
}

// Raises the first device-side failure since the last check (bad expert ids, timed-out waits).
void check_layer(int64_t handle) {
  const auto l = find_layer(handle);
  translate_errors("check", [&] { l->layer->check(); });
}

// Whether a cross-rank wait of the layer's world has failed and reset() not yet been called
// (comm::World::faulted: pinned memory only, no sync).
bool layer_faulted(int64_t handle) {
  const auto l = find_layer(handle);
  return translate_errors("faulted", [&] { return l->world->faulted(); });
}

// Brings the layer's world back after a failed cross-rank wait (collective over the world's ranks),
// on the current stream.
void reset_layer(int64_t handle) {
  const auto l = find_layer(handle);
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(l->device));
  translate_errors("reset", [&] { l->layer->reset(at::cuda::getCurrentCUDAStream().stream()); });
}

// On the current stream: the launches after it in stream order (graph replays included) use it.
void set_timeout(int64_t handle, double seconds) {
  const auto l = find_layer(handle);
  TORCH_CHECK_VALUE(std::isfinite(seconds) && seconds > 0.0 && seconds <= 3600.0,
                    "caracal.set_timeout: seconds must be in (0, 3600], got ", seconds);
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(l->device));
  translate_errors("set_timeout", [&] {
    l->world->set_wait_timeout(std::chrono::nanoseconds(static_cast<int64_t>(seconds * 1e9)),
                               at::cuda::getCurrentCUDAStream().stream());
  });
}

// The engine's fault flag as a float32 scalar tensor aliasing it (comm::World::fault_flag of its
// first local rank: a loopback world's ranks are aborted together): 0.0 while healthy, 1.0 from a
// timed-out wait until reset(). The tensor keeps the engine alive.
Tensor fault_flag(int64_t handle) {
  auto l = find_layer(handle);
  const auto options = at::TensorOptions().dtype(at::kFloat).device(at::kCUDA, static_cast<c10::DeviceIndex>(l->device));
  float* flag = const_cast<float*>(l->world->fault_flag(0));
  return at::from_blob(flag, {}, [keep = std::move(l)](void*) {}, options);
}

// Fault injection for the tests, on the current stream: `rank`'s CTAs arrive `seconds` late at its
// next world barrier, in whichever launch or graph replay that is (comm::World::stall_next_barrier).
void stall_next_barrier(int64_t handle, int64_t rank, double seconds) {
  const auto l = find_layer(handle);
  TORCH_CHECK_VALUE(std::isfinite(seconds) && seconds >= 0.0 && seconds <= 3600.0,
                    "caracal.stall_next_barrier: seconds must be in [0, 3600], got ", seconds);
  TORCH_CHECK_VALUE(rank >= 0 && rank < l->world->world_size(), "caracal.stall_next_barrier: rank must be in [0, ",
                    l->world->world_size(), "), got ", rank);
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(l->device));
  translate_errors("stall_next_barrier", [&] {
    l->world->stall_next_barrier(static_cast<int>(rank), std::chrono::nanoseconds(static_cast<int64_t>(seconds * 1e9)),
                                 at::cuda::getCurrentCUDAStream().stream());
  });
}

// ---- Traced ops ---------------------------------------------------------------------------------

// The traced ops name their layer by a CPU int64 scalar tensor rather than an int: torch.compile
// specializes on ints, so with an int every layer of a model would compile its own graph.
int64_t handle_of(const char* op, const Tensor& layer) {
  TORCH_CHECK_VALUE(layer.device().is_cpu() && layer.numel() == 1 && layer.scalar_type() == at::kLong, "caracal.", op,
                    ": layer must be the CPU int64 scalar tensor of a layer handle (caracal.MoE's _layer), got ",
                    layer.scalar_type(), " on ", layer.device(), " with ", layer.numel(), " elements");
  return layer.item<int64_t>();
}

// Every local rank's forward arguments over the stacked tensors (y: null when not given).
std::vector<MoEForwardArgs> forward_args(const Dims& d, const Tensor& x, const Tensor& topk_idx,
                                         const Tensor& topk_scores, const std::optional<Tensor>& shared_scale,
                                         const std::vector<Tensor>& kernel, const std::optional<Tensor>& w_fp8,
                                         const Tensor* y) {
  std::vector<MoEForwardArgs> args(static_cast<size_t>(d.ranks));
  for (int64_t r = 0; r < d.ranks; ++r) {
    MoEForwardArgs& a = args[static_cast<size_t>(r)];
    a.x = ptr<const bf16>(x, r * d.tokens * d.hidden);
    a.topk_idx = ptr<const int32_t>(topk_idx, r * d.tokens * d.top_k);
    a.topk_scores = ptr<const float>(topk_scores, r * d.tokens * d.top_k);
    a.shared_scale = shared_scale ? ptr<const float>(*shared_scale, r * d.tokens) : nullptr;
    a.weights = rank_weights(d, r, kernel, w_fp8);
    a.y = y != nullptr ? ptr<bf16>(*y, r * d.tokens * d.hidden) : nullptr;
  }
  return args;
}

// The blocks of quantized weights (rank_weights): only for FP8 layers, uint8 [local ranks][bytes],
// contiguous on the layer's device, each row 256-byte aligned.
void check_w_fp8(const char* op, const TorchLayer& l, const Dims& d, const std::optional<Tensor>& w_fp8) {
  if (!w_fp8) return;
  TORCH_CHECK_VALUE(l.config.precision == Precision::kFP8, "caracal.", op,
                    ": w_fp8 must be None: the layer is bf16 (precision='fp8' quantizes weights)");
  const int64_t bytes = static_cast<int64_t>(l.layer->fp8_weight_bytes());
  check_tensor(op, "w_fp8", *w_fp8, l.device, at::kByte, {d.ranks, bytes});
  TORCH_CHECK_VALUE(reinterpret_cast<uintptr_t>(w_fp8->data_ptr()) % 256 == 0, "caracal.", op,
                    ": w_fp8 must be 256-byte aligned (a tensor of its own, not a view at an offset)");
}

// The forward's inputs, checked as moe_forward and moe_backward take them.
void check_inputs(const char* op, const TorchLayer& l, const Dims& d, const Tensor& x, const Tensor& topk_idx,
                  const Tensor& topk_scores, const std::optional<Tensor>& shared_scale) {
  const int64_t rows = d.ranks * d.tokens;
  check_tensor(op, "x", x, l.device, at::kBFloat16, {rows, d.hidden});
  check_tensor(op, "topk_idx", topk_idx, l.device, at::kInt, {rows, d.top_k});
  check_tensor(op, "topk_scores", topk_scores, l.device, at::kFloat, {rows, d.top_k});
  if (shared_scale) {
    TORCH_CHECK_VALUE(d.has_shared, "caracal.", op, ": shared_scale needs a layer with a shared expert");
    check_tensor(op, "shared_scale", *shared_scale, l.device, at::kFloat, {rows});
  }
}

std::tuple<Tensor, Tensor> moe_forward(const Tensor& layer, const Tensor& x, const Tensor& topk_idx,
                                       const Tensor& topk_scores, const Tensor& w_gate_up, const Tensor& w_down,
                                       const std::optional<Tensor>& shared_w_gate_up,
                                       const std::optional<Tensor>& shared_w_down,
                                       const std::optional<Tensor>& shared_scale, const std::optional<Tensor>& w_fp8) {
  const char* op = "moe_forward";
  const auto l = find_layer(handle_of(op, layer));
  const Dims d = dims_of(*l);
  check_inputs(op, *l, d, x, topk_idx, topk_scores, shared_scale);
  check_weights(op, *l, d, w_gate_up, w_down, shared_w_gate_up, shared_w_down);
  check_w_fp8(op, *l, d, w_fp8);
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(l->device));
  Tensor y = at::empty({d.ranks * d.tokens, d.hidden}, x.options());
  // The bf16 weights live until the kernels that read them have run (the caching allocator
  // orders their reuse after the stream's work).
  const std::vector<Tensor> kernel = kernel_weights(w_gate_up, w_down, shared_w_gate_up, shared_w_down);
  const std::vector<MoEForwardArgs> args = forward_args(d, x, topk_idx, topk_scores, shared_scale, kernel, w_fp8, &y);
  const uint64_t forward_id = translate_errors(op, [&] {
    l->layer->check();  // a failure of earlier work surfaces here, before new work is enqueued
    return l->layer->forward(args, at::cuda::getCurrentCUDAStream().stream()).forward_id();
  });
  return {y, at::scalar_tensor(static_cast<int64_t>(forward_id), at::kLong)};
}

// The gradients of forward `forward_id`, given that forward's inputs and weights (autograd saves
// them): MoELayer replays the forward first if the layer ran another one since.
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> moe_backward(
    const Tensor& layer, const Tensor& forward_id, const Tensor& x, const Tensor& topk_idx, const Tensor& topk_scores,
    const std::optional<Tensor>& shared_scale, const Tensor& dy, const Tensor& w_gate_up, const Tensor& w_down,
    const std::optional<Tensor>& shared_w_gate_up, const std::optional<Tensor>& shared_w_down,
    const std::optional<Tensor>& w_fp8) {
  const char* op = "moe_backward";
  const auto l = find_layer(handle_of(op, layer));
  const Dims d = dims_of(*l);
  const int64_t rows = d.ranks * d.tokens;
  TORCH_CHECK_VALUE(forward_id.device().is_cpu() && forward_id.numel() == 1 && forward_id.scalar_type() == at::kLong,
                    "caracal.moe_backward: forward_id must be the CPU int64 scalar that moe_forward returned");
  check_inputs(op, *l, d, x, topk_idx, topk_scores, shared_scale);
  check_tensor(op, "dy", dy, l->device, at::kBFloat16, {rows, d.hidden});
  check_weights(op, *l, d, w_gate_up, w_down, shared_w_gate_up, shared_w_down);
  check_w_fp8(op, *l, d, w_fp8);
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(l->device));
  // fp32 weights are cast again: the same bf16 values the forward read.
  const std::vector<Tensor> kernel = kernel_weights(w_gate_up, w_down, shared_w_gate_up, shared_w_down);
  const auto f32 = dy.options().dtype(at::kFloat);
  // Weight gradients in the weights' dtype, written so by the kernels (bf16: one rounding of the
  // fp32 sums). The shared expert's gradient comes per local rank and is summed below: in fp32
  // when there are several.
  const auto grad_options = dy.options().dtype(w_gate_up.scalar_type());
  const bool bf16_grads = w_gate_up.scalar_type() == at::kBFloat16;
  const auto shared_options = d.ranks == 1 ? grad_options : f32;
  const bool bf16_shared_grads = bf16_grads && d.ranks == 1;
  const bool shared_scaled = shared_scale.has_value();
  Tensor dx = at::empty({rows, d.hidden}, dy.options());
  Tensor d_scores = at::empty({rows, d.top_k}, f32);
  Tensor d_w_gate_up = at::empty(w_gate_up.sizes(), grad_options);
  Tensor d_w_down = at::empty(w_down.sizes(), grad_options);
  Tensor d_shared_gate_up = at::empty({d.has_shared ? d.ranks : 0, 2 * d.shared_inter, d.hidden}, shared_options);
  Tensor d_shared_down = at::empty({d.has_shared ? d.ranks : 0, d.hidden, d.shared_inter}, shared_options);
  Tensor d_shared_scale = at::empty({shared_scaled ? rows : 0}, f32);
  std::vector<MoEBackwardArgs> args(static_cast<size_t>(d.ranks));
  for (int64_t r = 0; r < d.ranks; ++r) {
    MoEBackwardArgs& a = args[static_cast<size_t>(r)];
    a.dy = ptr<const bf16>(dy, r * d.tokens * d.hidden);
    a.dx = ptr<bf16>(dx, r * d.tokens * d.hidden);
    a.d_topk_scores = ptr<float>(d_scores, r * d.tokens * d.top_k);
    const int64_t gate_up_at = r * d.local_experts * 2 * d.inter * d.hidden, down_at = r * d.local_experts * d.hidden * d.inter;
    if (bf16_grads) {
      a.d_w_gate_up_bf16 = ptr<bf16>(d_w_gate_up, gate_up_at);
      a.d_w_down_bf16 = ptr<bf16>(d_w_down, down_at);
    } else {
      a.d_w_gate_up = ptr<float>(d_w_gate_up, gate_up_at);
      a.d_w_down = ptr<float>(d_w_down, down_at);
    }
    if (d.has_shared && bf16_shared_grads) {
      a.d_shared_w_gate_up_bf16 = ptr<bf16>(d_shared_gate_up);
      a.d_shared_w_down_bf16 = ptr<bf16>(d_shared_down);
    } else if (d.has_shared) {
      a.d_shared_w_gate_up = ptr<float>(d_shared_gate_up, r * 2 * d.shared_inter * d.hidden);
      a.d_shared_w_down = ptr<float>(d_shared_down, r * d.hidden * d.shared_inter);
    }
    a.d_shared_scale = shared_scaled ? ptr<float>(d_shared_scale, r * d.tokens) : nullptr;
  }
  translate_errors(op, [&] {
    l->layer->check();
    const MoEContext context = l->layer->context(
        static_cast<uint64_t>(forward_id.item<int64_t>()),
        forward_args(d, x, topk_idx, topk_scores, shared_scale, kernel, w_fp8, nullptr));
    l->layer->backward(args, context, at::cuda::getCurrentCUDAStream().stream());
  });
  // Summed in a fixed order (rank 0, 1, ...): deterministic.
  const auto sum_ranks = [&](const Tensor& t) { return t.size(0) == 1 ? t[0] : t.sum(0).to(grad_options); };
  return {dx,
          d_scores,
          d_w_gate_up,
          d_w_down,
          d.has_shared ? sum_ranks(d_shared_gate_up) : at::empty({0}, grad_options),
          d.has_shared ? sum_ranks(d_shared_down) : at::empty({0}, grad_options),
          d_shared_scale};
}

// FP8 layers: every local rank's routed weights quantized into its row of w_fp8 (what moe_forward
// and moe_backward read when given it), on the current stream.
void quantize_weights(const Tensor& layer, const Tensor& w_gate_up, const Tensor& w_down,
                      const std::optional<Tensor>& shared_w_gate_up, const std::optional<Tensor>& shared_w_down,
                      const Tensor& w_fp8) {
  const char* op = "quantize_weights";
  const auto l = find_layer(handle_of(op, layer));
  const Dims d = dims_of(*l);
  TORCH_CHECK_VALUE(l->config.precision == Precision::kFP8, "caracal.", op,
                    ": the layer is bf16 (precision='fp8' quantizes weights)");
  check_weights(op, *l, d, w_gate_up, w_down, shared_w_gate_up, shared_w_down);
  check_w_fp8(op, *l, d, w_fp8);
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(l->device));
  const std::vector<Tensor> kernel = kernel_weights(w_gate_up, w_down, shared_w_gate_up, shared_w_down);
  translate_errors(op, [&] {
    for (int64_t r = 0; r < d.ranks; ++r) {
      MoEWeights w = rank_weights(d, r, kernel, std::nullopt);
      l->layer->quantize_weights(w, ptr<uint8_t>(w_fp8, r * w_fp8.size(1)), at::cuda::getCurrentCUDAStream().stream());
    }
  });
}

// Bytes of one local rank's quantized weights (0: a bf16 layer).
int64_t fp8_weight_bytes(int64_t handle) {
  const auto l = find_layer(handle);
  return l->config.precision == Precision::kFP8 ? static_cast<int64_t>(l->layer->fp8_weight_bytes()) : 0;
}

}  // namespace

TORCH_LIBRARY(caracal, m) {
  m.def("nccl_unique_id() -> Tensor");
  m.def(
      "create_layer(int hidden, int intermediate, int num_experts, int top_k, int shared_intermediate, int ep_size, "
      "int tokens_per_rank, bool normalize, float router_scale, str backend, int rank, Tensor? unique_id, "
      "int device, int gemm_ctas, int exchange_sms, bool fused_forward, int ring_rows, bool bf16_weight_gradients, "
      "float timeout, str gate_up_layout='interleaved', str precision='bf16', bool fp8_weight_gradients=True) -> int");
  m.def("destroy_layer(int layer) -> ()");
  m.def("quantize_weights(Tensor layer, Tensor w_gate_up, Tensor w_down, Tensor? shared_w_gate_up, "
        "Tensor? shared_w_down, Tensor(a!) w_fp8) -> ()");
  m.def("fp8_weight_bytes(int layer) -> int");
  m.def("layer_holders(int layer) -> int");
  m.def("layer_memory(int layer) -> int[]");
  m.def("check(int layer) -> ()");
  m.def("faulted(int layer) -> bool");
  m.def("reset(int layer) -> ()");
  m.def("set_timeout(int layer, float seconds) -> ()");
  m.def("stall_next_barrier(int layer, int rank, float seconds) -> ()");
  m.def("fault_flag(int layer) -> Tensor");
  m.def(
      "moe_forward(Tensor layer, Tensor x, Tensor topk_idx, Tensor topk_scores, Tensor w_gate_up, Tensor w_down, "
      "Tensor? shared_w_gate_up, Tensor? shared_w_down, Tensor? shared_scale, Tensor? w_fp8=None) -> "
      "(Tensor y, Tensor forward_id)");
  m.def(
      "moe_backward(Tensor layer, Tensor forward_id, Tensor x, Tensor topk_idx, Tensor topk_scores, "
      "Tensor? shared_scale, Tensor dy, Tensor w_gate_up, Tensor w_down, Tensor? shared_w_gate_up, "
      "Tensor? shared_w_down, Tensor? w_fp8=None) -> (Tensor dx, Tensor d_topk_scores, Tensor d_w_gate_up, "
      "Tensor d_w_down, "
      "Tensor d_shared_w_gate_up, Tensor d_shared_w_down, Tensor d_shared_scale)");
  m.impl("nccl_unique_id", &nccl_unique_id);
  m.impl("create_layer", &create_layer);
  m.impl("destroy_layer", &destroy_layer);
  m.impl("fp8_weight_bytes", &fp8_weight_bytes);
  m.impl("layer_holders", &layer_holders);
  m.impl("layer_memory", &layer_memory);
  m.impl("check", &check_layer);
  m.impl("faulted", &layer_faulted);
  m.impl("reset", &reset_layer);
  m.impl("set_timeout", &set_timeout);
  m.impl("stall_next_barrier", &stall_next_barrier);
  m.impl("fault_flag", &fault_flag);
}

TORCH_LIBRARY_IMPL(caracal, CUDA, m) {
  m.impl("moe_forward", &moe_forward);
  m.impl("moe_backward", &moe_backward);
  m.impl("quantize_weights", &quantize_weights);
}

}  // namespace caracal::torch_ext
