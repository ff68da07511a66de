#pragma once
// The fp64 reference's options (caracal/reference.hpp, bf16-rounding mode) that round a step as a
// given MoELayer does: y's sums per (token, rank), or per macrobatch of its ring, or per route;
// dx's per (token, other rank, macrobatch) where the layer groups its dx rows. For the layer's GPU
// tests and `caracal bench`'s validation alike. Host only.
#include <cstdint>
#include <utility>
#include <vector>

#include "caracal/layer_config.hpp"
#include "caracal/reference.hpp"
#include "caracal/routing.hpp"
#include "caracal/schedule.hpp"

namespace caracal::checks {

// How a layer groups the rows it sums before rounding them to bf16.
struct LayerRounding {
  int64_t ring_rows = 0;        // MoELayer::ring_rows(): y per macrobatch of this many rows; 0: per (token, rank)
  bool rows_per_route = false;  // layer::LayerExperiments::rows_per_route: y rounds each route's row
  bool dx_groups = false;       // MoELayer::groups_dx_rows()
  bool fp8_experts = false;     // an FP8 layer's operands (ReferenceOptions::fp8_experts)
};

// The schedule rows the layer's grouped GEMMs use (tile_m = 128).
inline constexpr int64_t kLayerTileM = 128;

// F4's groups of home rank `rank`'s routes on a fused layer whose ring holds `ring_rows` rows: a
// token's routes on one rank and in one macrobatch.
inline std::vector<int64_t> ring_route_groups(const Schedule& schedule, int rank, int64_t ring_rows) {
  std::vector<int64_t> groups;
  for (const RouteLocation& at : schedule.routes[static_cast<size_t>(rank)]) {
    groups.push_back(at.row < 0 ? -1 : static_cast<int64_t>(at.dst_rank) * (int64_t{1} << 32) + at.row / ring_rows);
  }
  return groups;
}

// Every home rank's reference options for `routing` (W ranks, `num_experts` experts) on a layer
// that rounds as `rounding` says.
inline std::vector<ReferenceOptions> layer_reference_options(const RouterNormalization& router, const Routing& routing,
                                                             int64_t num_experts, const LayerRounding& rounding) {
  const int64_t W = routing.world_size;
  ReferenceOptions base;
  base.router = router;
  base.round_intermediates_to_bf16 = true;
  base.experts_per_rank = num_experts / W;
  base.fp8_experts = rounding.fp8_experts;
  const Schedule schedule =
      rounding.ring_rows > 0 ? build_schedule(routing, num_experts, kLayerTileM) : Schedule{};
  const size_t routes = static_cast<size_t>(routing.tokens_per_rank * routing.top_k);
  std::vector<ReferenceOptions> out;
  for (int r = 0; r < W; ++r) {
    ReferenceOptions options = base;
    if (rounding.ring_rows > 0) options.route_groups = ring_route_groups(schedule, r, rounding.ring_rows);
    if (rounding.dx_groups) {  // per (token, other rank) and macrobatch; ring_rows 0: one macrobatch
      const int32_t* ids = routing.rank_topk(r);
      options.dx_route_groups.resize(routes);
      for (size_t route = 0; route < routes; ++route) {
        const int64_t dst = ids[route] < 0 ? r : ids[route] / options.experts_per_rank;
        options.dx_route_groups[route] = dst == r ? -1  // the rank's own tokens: a row per route
                                                  : (rounding.ring_rows > 0 ? options.route_groups[route] : dst);
      }
    }
    if (rounding.rows_per_route) {
      options.route_groups.resize(routes);
      for (size_t route = 0; route < routes; ++route) options.route_groups[route] = static_cast<int64_t>(route);
    }
    out.push_back(std::move(options));
  }
  return out;
}

}  // namespace caracal::checks
