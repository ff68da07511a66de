#include "validation_ring.hpp"

#include <algorithm>

#include "caracal/error.hpp"
#include "caracal/plan.hpp"
#include "caracal/schedule.hpp"

namespace caracal::bench_tool {

namespace {

constexpr int64_t kTileM = 128;  // the layer's schedule tiles and ring granularity

int64_t padded_rows_max(const Routing& routing, int64_t num_experts) {
  const Schedule schedule = build_schedule(routing, num_experts, kTileM);
  int64_t most = 0;
  for (const RankSchedule& r : schedule.ranks) most = std::max(most, r.padded_rows());
  return most;
}

int64_t over(int64_t rows, int64_t ring) { return std::max<int64_t>(1, (rows + ring - 1) / ring); }

}  // namespace

int64_t macrobatches(const Routing& routing, int64_t num_experts, int64_t ring_rows) {
  CARACAL_CHECK(ring_rows > 0, "macrobatches: ring_rows must be positive, got ", ring_rows);
  return over(padded_rows_max(routing, num_experts), ring_rows);
}

int64_t resolved_ring(const LayerConfig& config, int option, int sms) {
  return option > 0 ? option : default_ring_rows(config, sms);
}

RingChoice choose_ring(int timed_option, int64_t timed_macrobatches, const LayerConfig& small, const Routing& routing,
                       int sms) {
  RingChoice c;
  const int64_t rows = padded_rows_max(routing, small.shape.num_experts);
  c.option = timed_option;
  c.rows = resolved_ring(small, timed_option, sms);
  c.macrobatches = over(rows, c.rows);
  c.how = timed_option > 0 ? "the timed ring" : "the default ring, as timed";
  if (c.macrobatches == timed_macrobatches) return c;
  // The largest ring (a multiple of 128) that gives the validated step as many macrobatches as
  // the timed one, or as many as it can have (one per 128 rows).
  const int64_t target = std::min(timed_macrobatches, over(rows, kTileM));
  int64_t ring = kTileM;
  for (int64_t r = kTileM; r <= std::max(rows, kTileM); r += kTileM) {
    if (over(rows, r) >= target) ring = r;
  }
  c.option = static_cast<int>(ring);
  c.rows = ring;
  c.macrobatches = over(rows, ring);
  c.how = ring == timed_option ? "the timed ring" : "scaled";
  return c;
}

}  // namespace caracal::bench_tool
