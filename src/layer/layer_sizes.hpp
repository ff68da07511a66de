#pragma once
// The sizes a MoELayer derives from its LayerConfig and options, the token exchange it is built on,
// and what the ranks of its world must agree on. Host only, no CUDA calls.
#include <cstdint>
#include <vector>

#include "caracal/layer_config.hpp"
#include "caracal/moe_layer.hpp"
#include "caracal/row_format.hpp"
#include "caracal/transfer/token_exchange.hpp"
#include "layer/layer_experiments.hpp"

namespace caracal::layer {

struct LayerSizes {
  int world_size = 0;           // W
  int tokens = 0;               // T per rank
  int top_k = 0;                // k
  int hidden = 0;               // D
  int intermediate = 0;         // I
  int local_experts = 0;        // L
  bool has_shared = false;
  int shared_intermediate = 0;  // Is (0 without a shared expert)
  // The rows of x, dy and the activation in the exchange's heap and the local buffers: bf16 in
  // either precision (an FP8 layer quantizes them on the expert side, into its own buffers).
  RowFormat rows;
  // The routed experts run DeepSeek-V3's FP8 recipe (gemm::Fp8ExpertPass, on v1's launches).
  bool fp8 = false;
  // FP8 layers: the weight gradients by the FP8 GEMMs on rows quantized down their columns
  // (MoELayerOptions::fp8_weight_gradients), else by the bf16 GEMMs on the bf16 rows.
  bool fp8_weight_grads = false;
  // Rows of the routed grouped GEMMs: the exchange's row capacity W*T*k + L*127 rounded down to
  // a multiple of 128. Every schedule fits: its padded segments total at most the capacity and
  // are a multiple of 128.
  int routed_rows = 0;
  // Rows of the routed experts' row buffers (gate_up, activation; the exchange's expert_x and
  // expert_dy): the fused layer's ring (ring_rows <= routed_rows, caracal/schedule_view.hpp), or
  // routed_rows (v1, whose standalone launches run over the whole schedule).
  int ring_rows = 0;
  int shared_rows = 0;          // T rounded up to 128: the shared expert's one padded segment
  // The fp32 partial sums bf16 weight gradients carry between macrobatches (MoELayerOptions::
  // bf16_weight_gradients, and a ring shorter than the rows).
  bool weight_grad_partials = false;

  bool has_ring_past_rows() const { return ring_rows < routed_rows; }  // a step may need several macrobatches
  // The shared expert's rows are the T tokens (T a multiple of 128: no zero padding), so it reads x
  // and dy where the exchange holds them and writes its output and dx where combine and reverse
  // dispatch read them: no copies of its own.
  bool shared_rows_in_place() const { return shared_rows == tokens; }
};

// Validates `config` for the layer (LayerConfig::validate, the exchange's limits)
// and derives the sizes: with ring_rows = 0 v1's (row buffers of routed_rows rows), else a fused
// layer's over a ring of min(ring_rows, routed_rows) rows (a multiple of 128), with the weight
// gradients' partial sums if bf16 ones may be asked for and the ring is shorter than the rows. Throws
// caracal::Error naming the field and the value expected.
LayerSizes layer_sizes(const LayerConfig& config, int ring_rows = 0, bool bf16_weight_gradients = true);

// Whether a layer built with `options` runs the fused path (its buffers: a ring, no expert_out):
// the fused kernels take at most fused::kFusedMaxLocalRanks local ranks, so with more ranks than
// that, which a loopback world may hold (and, as the layer's memory cannot depend on the world, for
// now any world of more ranks), it keeps v1's.
bool runs_fused(const LayerConfig& config, const MoELayerOptions& options);
// Whether the backward sums a token's dx rows per (token, rank) before they go home
// (fused::groups_dx_rows): the fused path at W > 1, a row per (token, rank) both ways.
bool sums_dx_per_token_rank(const LayerConfig& config, const MoELayerOptions& options,
                            const LayerExperiments& experiments);
// A layer's sizes (validating `config` first): a fused layer's over its ring (options.ring_rows, or
// caracal::default_ring_rows for `multiprocessors` SMs), v1's over the whole schedule.
LayerSizes layer_sizes(const LayerConfig& config, const MoELayerOptions& options, int multiprocessors);
// MoELayer::memory on a device of `multiprocessors` SMs (>= 1).
MoELayerMemory layer_memory(const LayerConfig& config, const MoELayerOptions& options,
                            const LayerExperiments& experiments, int multiprocessors);

// A value every rank of a world must hold the same.
struct AgreedValue {
  const char* name;
  int64_t value;
};
// What the ranks of a layer's world must agree on, or their symmetric heaps would not line up or
// they would move rows the others do not expect: the configuration, every option that lays out
// the heap or changes what crosses between ranks, as the layer resolves them (the default ring
// follows the device's `multiprocessors`), and the heap's bytes as a catch-all. Rank-local options
// (CTA and SM counts, how a rank copies its own rows, the allocator, the local buffers) are left
// out. Never throws: a value that follows from an invalid configuration or option is -1 (the layer
// then refuses it, on every rank alike).
std::vector<AgreedValue> values_ranks_agree_on(const LayerConfig& config, const MoELayerOptions& options,
                                               const LayerExperiments& experiments, int multiprocessors);

transfer::ExchangeShape exchange_shape(const LayerConfig& config);
// The exchange a layer of `sizes` runs on: expert_out only for v1's forward, the fused layer's ring
// (and its ring of expert_dx rows where it sums dx per (token, rank)).
transfer::ExchangeOptions exchange_options(const LayerConfig& config, const MoELayerOptions& layer_options,
                                           const LayerExperiments& experiments, const LayerSizes& sizes);

}  // namespace caracal::layer
