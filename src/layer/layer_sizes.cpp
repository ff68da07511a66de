#include "layer/layer_sizes.hpp"

#include <algorithm>
#include <limits>
#include <string>

#include "caracal/error.hpp"
#include "caracal/gemm/grouped_gemm.hpp"

namespace caracal::layer {

namespace {

constexpr int kTileM = gemm::kGroupedGemmTileM;
constexpr int64_t kMaxInt = std::numeric_limits<int32_t>::max();

int64_t round_up(int64_t value, int64_t multiple) { return (value + multiple - 1) / multiple * multiple; }

// The kernels take sizes as int.
int as_int(int64_t value, const char* field) {
  CARACAL_CHECK(value <= kMaxInt, "MoELayer: ", field, " must be below 2^31, got ", value);
  return static_cast<int>(value);
}

}  // namespace

transfer::ExchangeShape exchange_shape(const LayerConfig& config) {
  transfer::ExchangeShape shape;
  shape.tokens = config.tokens_per_rank;
  shape.top_k = config.shape.top_k;
  shape.hidden = config.shape.hidden;
  shape.num_experts = config.shape.num_experts;
  shape.tile_m = kTileM;  // expert segments padded to the grouped GEMMs' M tile
  return shape;
}

transfer::ExchangeOptions exchange_options(const LayerConfig& config, const LayerSizes& sizes, bool fused_forward,
                                           bool dx_group_ring) {
  transfer::ExchangeOptions options;
  options.forward = true;
  options.backward = true;
  options.shared_expert = config.shape.num_shared_experts > 0;
  options.expert_out = !fused_forward;
  // The dx GEMM stores the rows home (fused::gate_up_dgrad_to_home, fused::fused_backward); the
  // fused backward leaves those of tokens on other ranks in a ring of expert_dx rows to sum them
  // per (token, rank) first.
  options.ring_rows = fused_forward ? sizes.ring_rows : 0;
  options.expert_dx = fused_forward && dx_group_ring;
  return options;
}

LayerSizes layer_sizes(const LayerConfig& config, int ring_rows, bool bf16_weight_gradients) {
  try {
    config.validate();
  } catch (const Error& e) {
    throw Error(std::string("MoELayer: invalid LayerConfig: ") + e.what());
  }
  CARACAL_CHECK(config.precision == Precision::kBF16, "MoELayer: precision must be bf16 (FP8 is not in v1), got ",
                to_string(config.precision));
  const transfer::ExchangeSizes exchange = transfer::exchange_sizes(exchange_shape(config), config.ep_size);

  LayerSizes s;
  s.world_size = static_cast<int>(config.ep_size);
  s.tokens = static_cast<int>(config.tokens_per_rank);
  s.top_k = static_cast<int>(config.shape.top_k);
  s.hidden = as_int(config.shape.hidden, "hidden");
  s.intermediate = as_int(config.shape.intermediate, "intermediate");
  s.local_experts = static_cast<int>(exchange.local_experts);
  s.has_shared = config.shape.num_shared_experts > 0;
  s.shared_intermediate = as_int(config.shape.shared_intermediate, "shared_intermediate");
  s.routed_rows = static_cast<int>(exchange.row_capacity / kTileM * kTileM);
  CARACAL_CHECK(ring_rows >= 0 && ring_rows % kTileM == 0, "MoELayer: ring_rows must be 0 or a multiple of ", kTileM,
                ", got ", ring_rows);
  s.ring_rows = ring_rows > 0 ? std::min(ring_rows, s.routed_rows) : s.routed_rows;
  s.weight_grad_partials = bf16_weight_gradients && s.has_ring_past_rows();
  s.shared_rows = as_int(round_up(s.tokens, kTileM), "tokens_per_rank rounded up to 128");
  return s;
}

}  // namespace caracal::layer
