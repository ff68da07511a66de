#pragma once
// The layer's shape and its parallel/numeric configuration, with validation.
//
// Alignment rules (what the kernels need; validate() enforces them):
//   * hidden (D), intermediate (I) and shared_intermediate must be multiples of
//     kDimAlignmentBF16 = 64 for BF16 (one 128-byte swizzled K tile of bf16, 16-byte vectors) and
//     kDimAlignmentFP8 = 128 for FP8 (the 1x128 activation / 128x128 weight scaling blocks).
//   * num_experts must be divisible by ep_size; every rank holds num_experts / ep_size experts.
//   * 1 <= top_k <= num_experts; tokens_per_rank >= 1 (odd counts are fine).
//   * ep_size * tokens_per_rank * top_k < 2^31: routes are addressed with 32-bit indices.
//   * hidden, intermediate, shared_intermediate and num_experts at most 65536 (kMaxDimension,
//     kMaxExperts): far past any model's, and low enough that every byte, row and FLOP count
//     derived from them fits in int64.
#include <cstdint>
#include <string>

namespace caracal {

enum class Precision { kBF16, kFP8 };

const char* to_string(Precision p);
// Parses "bf16" or "fp8"; throws caracal::Error naming `what` otherwise.
Precision parse_precision(const std::string& text, const std::string& what = "precision");

inline constexpr int64_t kDimAlignmentBF16 = 64;
inline constexpr int64_t kDimAlignmentFP8 = 128;
inline constexpr int64_t kMaxSharedExperts = 1;
inline constexpr int64_t kMaxDimension = 65536;  // hidden, intermediate, shared_intermediate
inline constexpr int64_t kMaxExperts = 65536;    // num_experts

// g_j = scale * s_j / sum_{l in E} s_l when `normalize`, else scale * s_j.
struct RouterNormalization {
  bool normalize = true;
  double scale = 1.0;  // e.g. DeepSeek-V3's routed_scaling_factor
};

// The math of one MoE layer (DESIGN §1).
struct LayerShape {
  int64_t hidden = 0;               // D
  int64_t intermediate = 0;         // I of each routed expert
  int64_t num_experts = 0;          // E, global
  int64_t top_k = 0;                // k
  int64_t num_shared_experts = 0;   // 0 or 1
  int64_t shared_intermediate = 0;  // I of the shared expert (0 when there is none)

  // Forward FLOPs for `tokens` tokens: 6*T*k*D*I routed + 6*T*D*I_shared.
  double forward_flops(int64_t tokens) const;
};

// One rank's view of the expert-parallel layer.
struct LayerConfig {
  LayerShape shape;
  int64_t ep_size = 1;          // W, the expert-parallel degree
  int64_t tokens_per_rank = 0;  // T
  Precision precision = Precision::kBF16;
  RouterNormalization router;

  int64_t local_experts() const { return shape.num_experts / ep_size; }
  int64_t dim_alignment() const {
    return precision == Precision::kFP8 ? kDimAlignmentFP8 : kDimAlignmentBF16;
  }
  // Throws caracal::Error naming the first offending field and the value expected.
  void validate() const;
};

}  // namespace caracal
