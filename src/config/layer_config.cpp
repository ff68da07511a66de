#include "caracal/layer_config.hpp"

#include <cmath>
#include <limits>

#include "caracal/error.hpp"

namespace caracal {

const char* to_string(Precision p) { return p == Precision::kFP8 ? "fp8" : "bf16"; }

Precision parse_precision(const std::string& text, const std::string& what) {
  if (text == "bf16") return Precision::kBF16;
  if (text == "fp8") return Precision::kFP8;
  throw Error(what + ": expected 'bf16' or 'fp8', got '" + text + "'");
}

double LayerShape::forward_flops(int64_t tokens) const {
  const double t = static_cast<double>(tokens);
  return 6.0 * t * static_cast<double>(top_k) * static_cast<double>(hidden) *
             static_cast<double>(intermediate) +
         6.0 * t * static_cast<double>(num_shared_experts) * static_cast<double>(hidden) *
             static_cast<double>(shared_intermediate);
}

namespace {
void check_dim(const char* field, int64_t value, int64_t alignment, Precision precision) {
  CARACAL_CHECK(value >= 1 && value <= kMaxDimension, field, " must be in [1, ", kMaxDimension, "], got ", value);
  CARACAL_CHECK(value % alignment == 0, field, " must be a multiple of ", alignment, " for ",
                to_string(precision), ", got ", value);
}
}  // namespace

void LayerConfig::validate() const {
  const int64_t align = dim_alignment();
  check_dim("hidden", shape.hidden, align, precision);
  check_dim("intermediate", shape.intermediate, align, precision);
  CARACAL_CHECK(shape.num_experts >= 1 && shape.num_experts <= kMaxExperts, "num_experts must be in [1, ",
                kMaxExperts, "], got ", shape.num_experts);
  CARACAL_CHECK(shape.top_k >= 1 && shape.top_k <= shape.num_experts,
                "top_k must be in [1, num_experts=", shape.num_experts, "], got ", shape.top_k);
  CARACAL_CHECK(shape.num_shared_experts >= 0 && shape.num_shared_experts <= kMaxSharedExperts,
                "num_shared_experts must be 0 or 1, got ", shape.num_shared_experts);
  if (shape.num_shared_experts == 0) {
    CARACAL_CHECK(shape.shared_intermediate == 0,
                  "shared_intermediate must be 0 when num_shared_experts is 0, got ",
                  shape.shared_intermediate);
  } else {
    check_dim("shared_intermediate", shape.shared_intermediate, align, precision);
  }
  CARACAL_CHECK(ep_size >= 1, "ep_size must be at least 1, got ", ep_size);
  CARACAL_CHECK(shape.num_experts % ep_size == 0, "num_experts (", shape.num_experts,
                ") must be divisible by ep_size (", ep_size, ")");
  CARACAL_CHECK(tokens_per_rank >= 1, "tokens_per_rank must be at least 1, got ", tokens_per_rank);
  // ep_size * top_k <= num_experts^2 fits in int64; tokens_per_rank is bounded before the product.
  constexpr int64_t kMaxRoutes = std::numeric_limits<int32_t>::max();
  CARACAL_CHECK(tokens_per_rank <= kMaxRoutes / (ep_size * shape.top_k) &&
                    ep_size * shape.top_k * tokens_per_rank < kMaxRoutes,
                "ep_size * tokens_per_rank * top_k must be below 2^31 (32-bit route indices), got ", ep_size, " * ",
                tokens_per_rank, " * ", shape.top_k);
  CARACAL_CHECK(std::isfinite(router.scale) && router.scale > 0.0,
                "router.scale must be a positive finite number, got ", router.scale);
}

}  // namespace caracal
