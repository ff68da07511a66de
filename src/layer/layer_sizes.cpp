#include "layer/layer_sizes.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>

#include "caracal/error.hpp"
#include "caracal/gemm/grouped_gemm.hpp"
#include "caracal/plan.hpp"
#include "fused/fused_forward.hpp"
#include "layer/local_buffers.hpp"

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

// The number of fields of an aggregate: the most initializers it takes.
struct AnyField {
  template <typename T>
  operator T() const;
};
template <typename T, typename... Fields>
constexpr auto takes_initializers(int) -> decltype(void(T{std::declval<Fields>()...}), true) {
  return true;
}
template <typename T, typename... Fields>
constexpr bool takes_initializers(long) {
  return false;
}
template <typename T, typename... Fields>
constexpr size_t field_count() {
  if constexpr (takes_initializers<T, Fields..., AnyField>(0)) {
    return field_count<T, Fields..., AnyField>();
  } else {
    return sizeof...(Fields);
  }
}

}  // namespace

bool runs_fused(const LayerConfig& config, const MoELayerOptions& options) {
  return options.fused_forward && config.ep_size <= fused::kFusedMaxLocalRanks && config.precision == Precision::kBF16;
}

bool sums_dx_per_token_rank(const LayerConfig& config, const MoELayerOptions& options,
                            const LayerExperiments& experiments) {
  return runs_fused(config, options) && config.ep_size > 1 && !experiments.rows_per_route &&
         !experiments.dx_rows_per_route;
}

LayerSizes layer_sizes(const LayerConfig& config, const MoELayerOptions& options, int multiprocessors) {
  LayerSizes v1 = layer_sizes(config);  // validates config before a ring is sized from it
  v1.fp8_weight_grads = v1.fp8 && options.fp8_weight_gradients;
  if (!runs_fused(config, options)) return v1;
  CARACAL_CHECK(options.ring_rows >= 0 && options.ring_rows % kTileM == 0,
                "MoELayer: options.ring_rows must be 0 (default) or a positive multiple of ", kTileM, ", got ",
                options.ring_rows);
  const int64_t ring = options.ring_rows > 0 ? options.ring_rows : default_ring_rows(config, multiprocessors);
  constexpr int64_t kMostRows = int64_t(1) << 30;  // past any schedule the layer takes (int sizes)
  return layer_sizes(config, static_cast<int>(std::min(ring, kMostRows)), options.bf16_weight_gradients);
}

MoELayerMemory layer_memory(const LayerConfig& config, const MoELayerOptions& options,
                            const LayerExperiments& experiments, int multiprocessors) {
  const LayerSizes sizes = layer_sizes(config, options, multiprocessors);
  MoELayerMemory m;
  m.heap = transfer::TokenExchange::heap_bytes(exchange_shape(config), sizes.world_size,
                                               exchange_options(config, options, experiments, sizes));
  m.local = local_bytes(sizes);
  return m;
}

std::vector<AgreedValue> values_ranks_agree_on(const LayerConfig& config, const MoELayerOptions& options,
                                               const LayerExperiments& experiments, int multiprocessors) {
  // Every field of MoELayerOptions and LayerExperiments is either below or named here as
  // rank-local: gemm_ctas, exchange_sms, fused_comm_ctas (launch shapes), local_allocator,
  // bf16_weight_gradients (local buffers only), fp8_weight_gradients (how a rank computes its own
  // experts' weight gradients), pull_all_rows (how a rank copies rows of its own tokens). A new field
  // must be sorted into one or the other before this compiles.
  static_assert(field_count<MoELayerOptions>() == 8, "a new MoELayerOptions field: does it change the heap "
                                                     "or what crosses between ranks? (values_ranks_agree_on)");
  static_assert(field_count<LayerExperiments>() == 5, "a new LayerExperiments field: does it change the heap "
                                                      "or what crosses between ranks? (values_ranks_agree_on)");
  int64_t scale_bits = 0;
  static_assert(sizeof(scale_bits) == sizeof(config.router.scale));
  std::memcpy(&scale_bits, &config.router.scale, sizeof(scale_bits));
  const bool fused = runs_fused(config, options);
  int64_t ring_rows = -1, heap_bytes = -1;
  try {
    ring_rows = fused ? layer_sizes(config, options, multiprocessors).ring_rows : 0;
    heap_bytes = static_cast<int64_t>(layer_memory(config, options, experiments, multiprocessors).heap);
  } catch (const Error&) {
    // Refused after the values are compared, on every rank that holds the same ones.
  }
  return {
      {"hidden", config.shape.hidden},
      {"intermediate", config.shape.intermediate},
      {"num_experts", config.shape.num_experts},
      {"top_k", config.shape.top_k},
      {"num_shared_experts", config.shape.num_shared_experts},
      {"shared_intermediate", config.shape.shared_intermediate},
      {"tokens_per_rank", config.tokens_per_rank},
      {"ep_size", config.ep_size},
      {"precision", static_cast<int64_t>(config.precision)},
      {"router.normalize", config.router.normalize ? 1 : 0},
      {"router.scale (bits)", scale_bits},
      {"fused_forward (as run: false past 8 ranks)", fused ? 1 : 0},
      {"dx_rows_per_route (as run: false without the fused path)", fused && experiments.dx_rows_per_route ? 1 : 0},
      {"rows_per_route", experiments.rows_per_route ? 1 : 0},
      {"fused_fp8_forward (where the routed rows wait for combine)", experiments.fused_fp8_forward ? 1 : 0},
      {"fused_fp8_backward (where the dx rows go)", experiments.fused_fp8_backward ? 1 : 0},
      {"ring_rows (as run: the default follows the device's SMs; 0 without the fused forward)", ring_rows},
      {"symmetric heap bytes", heap_bytes},
  };
}

transfer::ExchangeShape exchange_shape(const LayerConfig& config) {
  transfer::ExchangeShape shape;
  shape.tokens = config.tokens_per_rank;
  shape.top_k = config.shape.top_k;
  shape.hidden = config.shape.hidden;
  shape.num_experts = config.shape.num_experts;
  shape.tile_m = kTileM;  // expert segments padded to the grouped GEMMs' M tile
  shape.precision = Precision::kBF16;  // x, dy rows in bf16 (LayerSizes::rows); FP8 adds x in e4m3 (fp8_dispatch)
  return shape;
}

transfer::ExchangeOptions exchange_options(const LayerConfig& config, const MoELayerOptions& layer_options,
                                           const LayerExperiments& experiments, const LayerSizes& sizes) {
  const bool fused = runs_fused(config, layer_options);
  transfer::ExchangeOptions options;
  options.forward = true;
  options.backward = true;
  options.shared_expert = config.shape.num_shared_experts > 0;
  options.expert_out = !fused;
  // The dx GEMM stores the rows home (gemm::gate_up_dgrad_to_home, fused::fused_backward); the
  // fused backward leaves those of tokens on other ranks in a ring of expert_dx rows to sum them
  // per (token, rank) first; the FP8 dx GEMM stores them in expert_dx for reverse_dispatch.
  options.ring_rows = fused ? sizes.ring_rows : 0;
  options.expert_dx = (fused && sums_dx_per_token_rank(config, layer_options, experiments)) || sizes.fp8;
  options.max_sms = layer_options.exchange_sms;
  options.rows_per_route = experiments.rows_per_route;
  options.fp8_dispatch = sizes.fp8;  // x quantized at home and pulled in e4m3 (the FP8 plan's forward)
  // dy likewise where the weight gradients are FP8 (the bf16 ones read dy's bf16 rows).
  options.fp8_reverse_combine = sizes.fp8 && sizes.fp8_weight_grads;
  return options;
}

LayerSizes layer_sizes(const LayerConfig& config, int ring_rows, bool bf16_weight_gradients) {
  try {
    config.validate();
  } catch (const Error& e) {
    throw Error(std::string("MoELayer: invalid LayerConfig: ") + e.what());
  }
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
  s.rows = row_format(Precision::kBF16);
  s.fp8 = config.precision == Precision::kFP8;
  s.routed_rows = static_cast<int>(exchange.row_capacity / kTileM * kTileM);
  CARACAL_CHECK(ring_rows >= 0 && ring_rows % kTileM == 0, "MoELayer: ring_rows must be 0 or a multiple of ", kTileM,
                ", got ", ring_rows);
  s.ring_rows = ring_rows > 0 ? std::min(ring_rows, s.routed_rows) : s.routed_rows;
  s.weight_grad_partials = bf16_weight_gradients && s.has_ring_past_rows();
  s.shared_rows = as_int(round_up(s.tokens, kTileM), "tokens_per_rank rounded up to 128");
  return s;
}

}  // namespace caracal::layer
