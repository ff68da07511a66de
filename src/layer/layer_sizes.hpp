#pragma once
// The sizes a MoELayer derives from its LayerConfig, and the token exchange it is built on.
// Host only, no CUDA calls.
#include <cstdint>

#include "caracal/layer_config.hpp"
#include "caracal/transfer/token_exchange.hpp"

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

// Validates `config` for the layer (LayerConfig::validate, bf16 only in v1, the exchange's limits)
// and derives the sizes: with ring_rows = 0 v1's (row buffers of routed_rows rows), else a fused
// layer's over a ring of min(ring_rows, routed_rows) rows (a multiple of 128), with the weight
// gradients' partial sums if bf16 ones may be asked for and the ring is shorter than the rows. Throws
// caracal::Error naming the field and the value expected.
LayerSizes layer_sizes(const LayerConfig& config, int ring_rows = 0, bool bf16_weight_gradients = true);

transfer::ExchangeShape exchange_shape(const LayerConfig& config);
// The exchange a layer of `sizes` runs on: expert_out only for v1's forward (fused_forward false),
// the fused layer's ring.
// `dx_group_ring`: the fused backward's ring of expert_dx rows (fused::groups_dx_rows).
transfer::ExchangeOptions exchange_options(const LayerConfig& config, const LayerSizes& sizes, bool fused_forward,
                                           bool dx_group_ring);

}  // namespace caracal::layer
