#pragma once
// The ring of the fused layer `caracal bench` validates: its step is much smaller than the timed
// one, so the timed ring may hold it in fewer macrobatches than it holds the timed step. The
// validation keeps the timed number of macrobatches where its step can have that many (a ring of
// 128 rows is the least), else the most it can have. Host only.
#include <cstdint>
#include <string>

#include "caracal/layer_config.hpp"
#include "caracal/routing.hpp"

namespace caracal::bench_tool {

// Macrobatches the busiest rank of `routing` walks over a ring of `ring_rows` rows: its padded
// schedule rows (caracal/schedule.hpp) over the ring, rounded up, at least 1.
int64_t macrobatches(const Routing& routing, int64_t num_experts, int64_t ring_rows);

// The ring a fused layer of `config` takes for MoELayerOptions::ring_rows = `option` on a device
// of `sms` SMs (0: caracal::default_ring_rows). The layer caps it at its row capacity, which
// changes no macrobatch count.
int64_t resolved_ring(const LayerConfig& config, int option, int sms);

// The validated fused layer's ring.
struct RingChoice {
  int option = 0;            // its MoELayerOptions::ring_rows (0: the default)
  int64_t rows = 0;          // the ring that gives (resolved_ring)
  int64_t macrobatches = 0;  // of the validated step
  // "the timed ring" or "the default ring, as timed" (the timed option, which gives the validated
  // step as many macrobatches as the timed one), or "scaled" (a ring of `rows` rows gives it as
  // many, or as many as it can have).
  std::string how;
};

// The ring for validating, with the step `routing` of `small`, a timed step of
// `timed_macrobatches` macrobatches over ring option `timed_option`.
RingChoice choose_ring(int timed_option, int64_t timed_macrobatches, const LayerConfig& small, const Routing& routing,
                       int sms);

}  // namespace caracal::bench_tool
