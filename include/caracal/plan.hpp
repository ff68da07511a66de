#pragma once
// The planner: what a layer configuration and a routing cost on each rank -- traffic, padding,
// the overlap granularity (DESIGN §2), memory and roofline times. It runs the host twin of the
// schedule, so its counts are exactly what the GPU schedule will hold.
#include <cstdint>
#include <string>
#include <vector>

#include "caracal/gemm/gemm_tiles.hpp"
#include "caracal/layer_config.hpp"
#include "caracal/routing.hpp"

namespace caracal {

// The bounds of PlanOptions (with LayerConfig's, every count the plan derives fits in int64).
inline constexpr int64_t kMaxPlanSms = 1024;
inline constexpr int64_t kMaxPlanTile = 1024;  // each side
inline constexpr int64_t kMaxPlanRingRows = (int64_t{1} << 31) - 1;  // row indices are 32-bit

struct PlanOptions {
  int64_t sm_count = 132;     // H200 / H100 SXM; in [1, kMaxPlanSms]
  int64_t tile_m = 128;       // GEMM tile rows: each expert segment is padded to it; in [1, kMaxPlanTile]
  int64_t tile_n = 256;       // GEMM tile columns; in [1, kMaxPlanTile]
  double tflops = 806.0;      // matrix rate (default_plan_tflops: bf16's)
  double nvlink_gbs = 370.0;  // per direction: what NCCL reaches on NVLink 4 (DESIGN §6)
  int64_t ring_rows = 0;      // 0 = sized from the balanced step (see Plan::ring_rows); at most kMaxPlanRingRows
  // The layer may be asked for bf16 weight gradients (MoELayerOptions::bf16_weight_gradients):
  // then a ring shorter than the rows keeps their fp32 partial sums (MemoryPlan::partials).
  bool bf16_weight_gradients = true;
  void validate() const;
};

// The matrix rate a plan of `precision` assumes unless told: dense cuBLAS GEMMs measured on an
// H200 on random data, bf16 806 TFLOP/s (DESIGN §6), FP8 1,135 (issue 47: 1,060-1,210 over its
// shapes; the layer's FP8 GEMMs are DeepSeek-V3's block-scaled ones).
double default_plan_tflops(Precision precision);

struct Spread {
  double min = 0, mean = 0, max = 0;
};

// Bytes each rank allocates for one MoELayer over the plan's ring (src/transfer/token_exchange.cu,
// src/layer/local_buffers.cpp: the layer's own layout, without 256-byte alignment; MoELayer::memory
// stays within 0.1% of it, tested).
struct MemoryPlan {
  int64_t symmetric = 0;  // per token and route, peer-visible: x, y, dy, dx (+ the shared expert's
                          // out and dx), the combine / dx slots, topk_idx, scores, gates, dg
  int64_t ring = 0;       // ring_rows rows of the routed experts' x, dy, gate/up and activation
                          // (and at W > 1 of dx, summed per (token, rank) before going home)
  int64_t schedule = 0;   // for the worst case: schedule rows, offsets, counts, inverse view, per-row
                          // g, dL/dg and router-gradient partials, the fused forward's task table
  int64_t saved = 0;      // the shared expert's rows (x, out, dy, gate/up, activation)
  int64_t partials = 0;   // fp32 sums of bf16 weight gradients between macrobatches (ring < rows)
  int64_t weights = 0;    // local routed experts + shared expert, in the layer's precision
  // The same buffers split as MoELayer::memory reports them: symmetric heap and local device
  // memory (layer_heap + layer_local = total() - weights); and MoELayer v1's (fused_forward false),
  // whose row buffers hold every row its schedule can have (every route of every rank on one) and
  // its forward's output rows.
  int64_t layer_heap = 0;
  int64_t layer_local = 0;
  int64_t v1_layer_heap = 0;
  int64_t v1_layer_local = 0;
  // FP8 plans: the FP8 layer as it runs today (v1's launches, rows crossing in bf16): v1's bf16
  // buffers, expert_dx over every row (reverse dispatch takes the dx rows home), the routed rows in
  // e4m3 with their 1 x 128 scales (x, activation, dy, d_gate_up), the FP8 dgrad's wider workspace
  // and the weights quantized in both orientations; its weights stay bf16 (`weights` counts the
  // design's e4m3 ones). 0 for bf16 plans.
  int64_t fp8_layer_heap = 0;
  int64_t fp8_layer_local = 0;
  int64_t fp8_layer_weights = 0;
  int64_t total() const { return symmetric + ring + schedule + saved + partials + weights; }
};

struct RooflinePlan {
  double forward_flops = 0;    // on the busiest rank
  double backward_flops = 0;   // on the busiest rank, replay of overwritten macrobatches included
  // Busiest direction of the busiest rank, cross-rank only: the fused kernels' design, one row per
  // (token, rank) and macrobatch of the ring both ways (the schedule's token rows); today's
  // kernels, the same (pulls, combine's pushes and the fused backward's dx pushes per (token,
  // rank) and macrobatch); MoELayer v1 before its transfers moved tokens once per rank, one row
  // per route.
  int64_t forward_nvlink_bytes = 0;
  int64_t backward_nvlink_bytes = 0;
  int64_t today_forward_nvlink_bytes = 0;
  int64_t today_backward_nvlink_bytes = 0;
  int64_t v1_forward_nvlink_bytes = 0;
  int64_t v1_backward_nvlink_bytes = 0;
  // The forward's pull alone on the busiest rank (x's rows in the layer's row format, scales
  // included), and the same rows in bf16: their ratio is what the row format saves on the pull
  // (FP8: (D + D / 32) / 2D, ~0.52).
  int64_t forward_pull_bytes = 0;
  int64_t forward_pull_bf16_bytes = 0;
  // FP8 plans: the design's bytes are FP8 rows + scales; today's FP8 layer (v1's launches) pulls x
  // in FP8 in the forward and dy in FP8 in the backward (FP8 weight gradients), whose dx rows go
  // home per route.
  double forward_compute_ms = 0, forward_nvlink_ms = 0;
  double backward_compute_ms = 0, backward_nvlink_ms = 0;
  const char* forward_bound() const { return forward_nvlink_ms > forward_compute_ms ? "nvlink" : "compute"; }
  const char* backward_bound() const { return backward_nvlink_ms > backward_compute_ms ? "nvlink" : "compute"; }
};

struct Plan {
  LayerConfig config;
  PlanOptions options;
  std::string routing_source;  // "uniform", "zipf:1.2", "trace:path", ...

  // Traffic: routes received per rank and per (global) expert.
  Spread routes_per_rank;
  Spread routes_per_expert;
  double rank_imbalance = 0;    // max / mean routes per rank
  double expert_imbalance = 0;  // max / mean routes per expert
  int64_t empty_experts = 0;
  int64_t empty_slots = 0;      // -1 entries over all ranks
  int64_t padded_rows_max = 0;  // schedule rows on the busiest rank
  int64_t padding_rows_total = 0;

  // Overlap granularity (DESIGN §2): a minibatch is the smallest chunk giving two full waves of
  // up/gate tiles; the ring holds ring_rows rows and the busiest rank needs `macrobatches` passes.
  int64_t overlap_min_rows = 0;  // 2 * sms * tile_m * tile_n / min(2I, D)
  int64_t minibatch_rows = 0;    // overlap_min_rows rounded up to tile_m
  int64_t ring_rows = 0;
  int64_t macrobatches = 0;
  int64_t replayed_rows = 0;     // rows backward re-pulls and recomputes on the busiest rank

  MemoryPlan memory;
  RooflinePlan roofline;
  std::vector<gemm::LayerGemmTile> gemm_tiles;  // the tiles the layer's grouped GEMMs run in
};

// The ring the planner sizes by default (PlanOptions::ring_rows = 0): a balanced step (T*k routes
// on each rank, every expert segment padded) in one macrobatch, rounded up to a minibatch (the
// overlap rule) for `sm_count` SMs and tile_m x tile_n tiles. Throws caracal::Error for an invalid
// config or an SM count or tile outside PlanOptions's bounds.
int64_t default_ring_rows(const LayerConfig& config, int64_t sm_count = 132, int64_t tile_m = 128, int64_t tile_n = 256);

// Throws caracal::Error when the routing does not match the configuration.
Plan make_plan(const LayerConfig& config, const Routing& routing, const std::string& routing_source,
               const PlanOptions& options);

}  // namespace caracal
