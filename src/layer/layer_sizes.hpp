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
  int shared_rows = 0;          // T rounded up to 128: the shared expert's one padded segment
};

// Validates `config` for the layer (LayerConfig::validate, bf16 only in v1, the exchange's limits)
// and derives the sizes. Throws caracal::Error naming the field and the value expected.
LayerSizes layer_sizes(const LayerConfig& config);

transfer::ExchangeShape exchange_shape(const LayerConfig& config);
// The exchange a layer of `config` runs on: expert_out only for v1's forward (fused_forward false).
transfer::ExchangeOptions exchange_options(const LayerConfig& config, bool fused_forward);

}  // namespace caracal::layer
