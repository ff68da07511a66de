#include "layer/argument_checks.hpp"

#include <cstdint>
#include <initializer_list>
#include <utility>

#include "caracal/error.hpp"
#include "caracal/gemm/expert_pass_fp8.hpp"

namespace caracal::layer {

namespace {

constexpr size_t kMatrixAlignment = 16;  // TMA boxes and 16-byte vector copies
constexpr size_t kFp8WeightAlignment = 256;  // gemm::fp8_expert_weight_buffers' block
constexpr const char* kNoShared = "the layer has no shared expert";

std::string dims(std::initializer_list<std::pair<const char*, int>> parts, const char* type) {
  std::string out;
  for (const auto& [name, value] : parts) out += "[" + std::string(name) + "=" + std::to_string(value) + "]";
  return out + " " + type;
}

PointerArg matrix(const void* ptr, const char* name, std::string shape) {
  return PointerArg{ptr, name, std::move(shape), kMatrixAlignment, Presence::kRequired, {}};
}

PointerArg elements(const void* ptr, const char* name, std::string shape, size_t element_bytes) {
  return PointerArg{ptr, name, std::move(shape), element_bytes, Presence::kRequired, {}};
}

// A shared-expert argument: required with a shared expert, forbidden without.
PointerArg shared_only(PointerArg arg, bool has_shared) {
  if (!has_shared) {
    arg.presence = Presence::kForbidden;
    arg.why = kNoShared;
  }
  return arg;
}

// A weight gradient asked for in fp32 (`name`) or in bf16 (`name`_bf16): exactly one of the two.
std::vector<PointerArg> gradient(const float* f32, const __nv_bfloat16* bf16, const char* name, const char* bf16_name,
                                 std::initializer_list<std::pair<const char*, int>> shape) {
  if (f32 == nullptr && bf16 != nullptr) return {matrix(bf16, bf16_name, dims(shape, "bf16"))};
  const std::string f32_type = std::string("fp32 (or ") + bf16_name + ": bf16)";
  std::vector<PointerArg> out{matrix(f32, name, dims(shape, f32_type.c_str()))};
  if (bf16 != nullptr) {
    PointerArg both = matrix(bf16, bf16_name, dims(shape, "bf16"));
    both.presence = Presence::kForbidden;
    both.why = std::string(name) + " is given too (pass exactly one of the two)";
    out.push_back(both);
  }
  return out;
}

void append(std::vector<PointerArg>& out, std::vector<PointerArg> args, bool present = true) {
  for (PointerArg& a : args) out.push_back(present ? std::move(a) : shared_only(std::move(a), false));
}

}  // namespace

void check_gate_up_layout(const MoEWeights& weights, const char* fn, int local_rank) {
  const auto layout = static_cast<int>(weights.w_gate_up_layout);
  CARACAL_CHECK(weights.w_gate_up_layout == gemm::GateUpLayout::kInterleaved ||
                    weights.w_gate_up_layout == gemm::GateUpLayout::kHalves,
                fn, ": ranks[", local_rank,
                "].weights.w_gate_up_layout must be gemm::GateUpLayout::kInterleaved or kHalves, got ", layout);
}

std::vector<PointerArg> forward_pointer_args(const MoEForwardArgs& a, const LayerSizes& s, bool with_output) {
  const int T = s.tokens, k = s.top_k, D = s.hidden, I = s.intermediate, L = s.local_experts;
  const int Is = s.shared_intermediate;
  std::vector<PointerArg> out;
  out.push_back(matrix(a.x, "x", dims({{"T", T}, {"D", D}}, "bf16")));
  out.push_back(elements(a.topk_idx, "topk_idx", dims({{"T", T}, {"k", k}}, "int32"), sizeof(int32_t)));
  out.push_back(elements(a.topk_scores, "topk_scores", dims({{"T", T}, {"k", k}}, "fp32"), sizeof(float)));
  PointerArg scale = elements(a.shared_scale, "shared_scale", dims({{"T", T}}, "fp32"), sizeof(float));
  scale.presence = Presence::kOptional;
  out.push_back(shared_only(scale, s.has_shared));
  out.push_back(matrix(a.weights.w_gate_up, "weights.w_gate_up", dims({{"L", L}, {"2I", 2 * I}, {"D", D}}, "bf16")));
  out.push_back(matrix(a.weights.w_down, "weights.w_down", dims({{"L", L}, {"D", D}, {"I", I}}, "bf16")));
  out.push_back(shared_only(
      matrix(a.weights.shared_w_gate_up, "weights.shared_w_gate_up", dims({{"2Is", 2 * Is}, {"D", D}}, "bf16")),
      s.has_shared));
  out.push_back(shared_only(
      matrix(a.weights.shared_w_down, "weights.shared_w_down", dims({{"D", D}, {"Is", Is}}, "bf16")), s.has_shared));
  PointerArg fp8{a.weights.w_fp8, "weights.w_fp8", "", kFp8WeightAlignment, Presence::kOptional, {}};
  if (s.fp8) {
    fp8.shape = std::to_string(gemm::fp8_expert_weight_bytes(L, D, I)) +
                " bytes of quantized weights (MoELayer::quantize_weights)";
  } else {
    fp8.presence = Presence::kForbidden;
    fp8.why = "the layer is bf16 (LayerConfig::precision)";
  }
  out.push_back(fp8);
  if (with_output) out.push_back(matrix(a.y, "y", dims({{"T", T}, {"D", D}}, "bf16")));
  return out;
}

std::vector<PointerArg> backward_pointer_args(const MoEBackwardArgs& a, const LayerSizes& s, bool shared_scaled) {
  const int T = s.tokens, k = s.top_k, D = s.hidden, I = s.intermediate, L = s.local_experts;
  const int Is = s.shared_intermediate;
  std::vector<PointerArg> out;
  out.push_back(matrix(a.dy, "dy", dims({{"T", T}, {"D", D}}, "bf16")));
  out.push_back(matrix(a.dx, "dx", dims({{"T", T}, {"D", D}}, "bf16")));
  out.push_back(elements(a.d_topk_scores, "d_topk_scores", dims({{"T", T}, {"k", k}}, "fp32"), sizeof(float)));
  append(out, gradient(a.d_w_gate_up, a.d_w_gate_up_bf16, "d_w_gate_up", "d_w_gate_up_bf16",
                       {{"L", L}, {"2I", 2 * I}, {"D", D}}));
  append(out, gradient(a.d_w_down, a.d_w_down_bf16, "d_w_down", "d_w_down_bf16", {{"L", L}, {"D", D}, {"I", I}}));
  append(out,
         gradient(a.d_shared_w_gate_up, a.d_shared_w_gate_up_bf16, "d_shared_w_gate_up", "d_shared_w_gate_up_bf16",
                  {{"2Is", 2 * Is}, {"D", D}}),
         s.has_shared);
  append(out,
         gradient(a.d_shared_w_down, a.d_shared_w_down_bf16, "d_shared_w_down", "d_shared_w_down_bf16",
                  {{"D", D}, {"Is", Is}}),
         s.has_shared);
  PointerArg d_scale = elements(a.d_shared_scale, "d_shared_scale",
                                dims({{"T", T}}, "fp32") + " (the forward was given a shared_scale)", sizeof(float));
  if (!shared_scaled) {
    d_scale.presence = Presence::kForbidden;
    d_scale.why = "the forward was given no shared_scale";
  }
  out.push_back(d_scale);
  return out;
}

std::vector<OutputBuffer> backward_outputs(const MoEBackwardArgs& a, const LayerSizes& s) {
  const size_t T = static_cast<size_t>(s.tokens), k = static_cast<size_t>(s.top_k), D = static_cast<size_t>(s.hidden);
  const size_t I = static_cast<size_t>(s.intermediate), L = static_cast<size_t>(s.local_experts);
  const size_t Is = static_cast<size_t>(s.shared_intermediate);
  // A gradient comes in fp32 or in bf16: whichever pointer is given.
  const auto either = [](float* f32, __nv_bfloat16* bf16, size_t count) {
    return f32 != nullptr ? OutputBuffer{f32, count * sizeof(float)} : OutputBuffer{bf16, count * sizeof(__nv_bfloat16)};
  };
  std::vector<OutputBuffer> out{
      {a.dx, T * D * sizeof(__nv_bfloat16)},
      {a.d_topk_scores, T * k * sizeof(float)},
      either(a.d_w_gate_up, a.d_w_gate_up_bf16, L * 2 * I * D),
      either(a.d_w_down, a.d_w_down_bf16, L * D * I),
      either(a.d_shared_w_gate_up, a.d_shared_w_gate_up_bf16, 2 * Is * D),
      either(a.d_shared_w_down, a.d_shared_w_down_bf16, D * Is),
      {a.d_shared_scale, T * sizeof(float)},
  };
  std::vector<OutputBuffer> given;
  for (const OutputBuffer& b : out) {
    if (b.data != nullptr) given.push_back(b);
  }
  return given;
}

void check_pointer_args(const std::vector<PointerArg>& args, const char* fn, int local_rank) {
  for (const PointerArg& a : args) {
    const std::string where = std::string(fn) + ": ranks[" + std::to_string(local_rank) + "]." + a.name;
    if (a.presence == Presence::kForbidden) {
      CARACAL_CHECK(a.ptr == nullptr, where, " must be null: ", a.why, "; got ", a.ptr);
      continue;
    }
    if (a.ptr == nullptr) {
      CARACAL_CHECK(a.presence == Presence::kOptional, where, " must be a ", a.alignment,
                    "-byte aligned device pointer to ", a.shape, ", got null");
      continue;
    }
    CARACAL_CHECK(reinterpret_cast<uintptr_t>(a.ptr) % a.alignment == 0, where, " must be ", a.alignment,
                  "-byte aligned (", a.shape, "), got ", a.ptr);
  }
}

void check_rank_count(size_t given, int local_ranks, const char* fn) {
  CARACAL_CHECK(given == static_cast<size_t>(local_ranks), fn, ": expected one argument struct per local rank (",
                local_ranks, "), got ", given);
}

}  // namespace caracal::layer
