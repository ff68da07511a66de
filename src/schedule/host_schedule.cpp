#include <algorithm>
#include <limits>
#include <numeric>

#include "caracal/error.hpp"
#include "caracal/schedule.hpp"

namespace caracal {

namespace {

constexpr int64_t kMaxRows = std::numeric_limits<int32_t>::max();  // rows use 32-bit indices

void check_arguments(const Routing& routing, int64_t num_experts, int64_t tile_m) {
  CARACAL_CHECK(tile_m >= 1 && tile_m <= kMaxRows, "schedule: tile_m must be in [1, 2^31), got ",
                tile_m);
  routing.validate(num_experts);
  CARACAL_CHECK(num_experts % routing.world_size == 0, "schedule: num_experts (", num_experts,
                ") must be divisible by the world size (", routing.world_size, ")");
}

// The routes to experts [first_expert, first_expert + experts), grouped by (expert, source
// rank), each group in (token, slot) order: a stable counting sort, O(routes + groups).
class RouteGroups {
 public:
  RouteGroups(const Routing& routing, int64_t first_expert, int64_t experts)
      : first_expert_(first_expert), world_(routing.world_size) {
    begin_.assign(static_cast<size_t>(experts * world_ + 1), 0);
    // Counts land one group to the right so that the prefix sum turns them into group starts.
    for_each_route(routing, experts, [&](int64_t group, int64_t) { ++begin_[group + 1]; });
    std::partial_sum(begin_.begin(), begin_.end(), begin_.begin());
    route_.resize(static_cast<size_t>(begin_.back()));
    std::vector<int64_t> cursor(begin_.begin(), begin_.end() - 1);
    for_each_route(routing, experts, [&](int64_t group, int64_t route) {
      route_[cursor[group]++] = static_cast<int32_t>(route);
    });
  }

  int64_t count(int64_t expert, int64_t source) const {
    const int64_t g = group(expert, source);
    return begin_[g + 1] - begin_[g];
  }
  // The j-th route (token * k + slot) from `source` to `expert`.
  int32_t route(int64_t expert, int64_t source, int64_t j) const {
    return route_[begin_[group(expert, source)] + j];
  }

 private:
  int64_t group(int64_t expert, int64_t source) const {
    return (expert - first_expert_) * world_ + source;
  }

  // Calls visit(group, token * k + slot) for every route to one of our experts, in
  // (source rank, token, slot) order.
  template <typename Visit>
  void for_each_route(const Routing& routing, int64_t experts, Visit visit) const {
    const int64_t routes_per_rank = routing.tokens_per_rank * routing.top_k;
    for (int64_t source = 0; source < world_; ++source) {
      const int32_t* ids = routing.rank_topk(source);
      for (int64_t r = 0; r < routes_per_rank; ++r) {
        const int64_t local = ids[r] - first_expert_;  // empty slots (-1) fall below the range
        if (local >= 0 && local < experts) visit(local * world_ + source, r);
      }
    }
  }

  int64_t first_expert_;
  int64_t world_;
  std::vector<int64_t> begin_;  // [groups + 1]
  std::vector<int32_t> route_;
};

// Deals the routes of one expert's sources into `out` like cards: round j takes the j-th route
// of every source that still has one, in source order. Round j therefore starts at
// sum_q min(c_q, j), and source p's card lands #{q < p : c_q > j} after that.
void deal_round_robin(const RouteGroups& groups, int64_t expert, int64_t world,
                      std::vector<int32_t>& active, ScheduleRow* out) {
  active.clear();
  for (int32_t source = 0; source < world; ++source) {
    if (groups.count(expert, source) > 0) active.push_back(source);
  }
  for (int64_t j = 0; !active.empty(); ++j) {
    for (const int32_t source : active) *out++ = {source, groups.route(expert, source, j)};
    active.erase(std::remove_if(active.begin(), active.end(),
                                [&](int32_t source) { return groups.count(expert, source) == j + 1; }),
                 active.end());
  }
}

// The token rows of a rank whose rows are laid out, and each row's token row (RankSchedule).
void lay_out_token_rows(const Routing& routing, RankSchedule& rs) {
  const int64_t world = routing.world_size, tokens = routing.tokens_per_rank, k = routing.top_k;
  // index[source][token]: its token row, or -1; first the tokens each source sends here.
  std::vector<std::vector<int32_t>> index(static_cast<size_t>(world), std::vector<int32_t>(static_cast<size_t>(tokens), -1));
  for (const ScheduleRow& row : rs.rows) {
    if (!row.is_padding()) index[static_cast<size_t>(row.src_rank)][static_cast<size_t>(row.src_route / k)] = 0;
  }
  std::vector<std::vector<int32_t>> sent(static_cast<size_t>(world));  // ascending tokens per source
  for (size_t source = 0; source < sent.size(); ++source) {
    for (int32_t token = 0; token < tokens; ++token) {
      if (index[source][static_cast<size_t>(token)] == 0) sent[source].push_back(token);
    }
  }
  // Deal round-robin: round j takes the j-th token of every source that still has one.
  rs.token_rows.clear();
  for (size_t j = 0;; ++j) {
    bool dealt = false;
    for (size_t source = 0; source < sent.size(); ++source) {
      if (j >= sent[source].size()) continue;
      const int32_t token = sent[source][j];
      index[source][static_cast<size_t>(token)] = static_cast<int32_t>(rs.token_rows.size());
      rs.token_rows.push_back({static_cast<int32_t>(source), token});
      dealt = true;
    }
    if (!dealt) break;
  }
  rs.row_token.assign(rs.rows.size(), -1);
  for (size_t r = 0; r < rs.rows.size(); ++r) {
    const ScheduleRow& row = rs.rows[r];
    if (!row.is_padding()) rs.row_token[r] = index[static_cast<size_t>(row.src_rank)][static_cast<size_t>(row.src_route / k)];
  }
}

RankSchedule lay_out_rank(const Routing& routing, const RouteGroups& groups, int64_t world, int64_t local_experts,
                          int64_t tile_m, int64_t rank) {
  RankSchedule rs;
  rs.expert_offset.assign(static_cast<size_t>(local_experts + 1), 0);
  rs.expert_count.assign(static_cast<size_t>(local_experts), 0);
  rs.source_count.assign(static_cast<size_t>(local_experts * world), 0);
  const int64_t first_expert = rank * local_experts;
  for (int64_t e = 0; e < local_experts; ++e) {
    for (int64_t source = 0; source < world; ++source) {
      const int64_t n = groups.count(first_expert + e, source);
      rs.source_count[e * world + source] = n;
      rs.expert_count[e] += n;
    }
    const int64_t padded = (rs.expert_count[e] + tile_m - 1) / tile_m * tile_m;
    rs.expert_offset[e + 1] = rs.expert_offset[e] + padded;
    CARACAL_CHECK(rs.expert_offset[e + 1] <= kMaxRows, "schedule: rank ", rank,
                  " needs more than 2^31 - 1 rows (32-bit row indices) with tile_m = ", tile_m);
  }
  rs.rows.assign(static_cast<size_t>(rs.padded_rows()), ScheduleRow{});
  std::vector<int32_t> active;
  for (int64_t e = 0; e < local_experts; ++e) {
    deal_round_robin(groups, first_expert + e, world, active, rs.rows.data() + rs.expert_offset[e]);
  }
  lay_out_token_rows(routing, rs);
  return rs;
}

// routes[home][token * k + slot] = where that route is processed.
std::vector<std::vector<RouteLocation>> invert(const std::vector<RankSchedule>& ranks,
                                               int64_t routes_per_rank) {
  std::vector<std::vector<RouteLocation>> routes(
      ranks.size(), std::vector<RouteLocation>(static_cast<size_t>(routes_per_rank)));
  for (size_t dst = 0; dst < ranks.size(); ++dst) {
    const std::vector<ScheduleRow>& rows = ranks[dst].rows;
    for (size_t row = 0; row < rows.size(); ++row) {
      if (rows[row].is_padding()) continue;
      routes[rows[row].src_rank][rows[row].src_route] = {static_cast<int32_t>(dst),
                                                         static_cast<int32_t>(row)};
    }
  }
  return routes;
}

}  // namespace

int64_t RankSchedule::routes() const {
  return std::accumulate(expert_count.begin(), expert_count.end(), int64_t{0});
}

Schedule build_schedule(const Routing& routing, int64_t num_experts, int64_t tile_m) {
  check_arguments(routing, num_experts, tile_m);
  const int64_t world = routing.world_size;
  const int64_t local_experts = num_experts / world;
  const RouteGroups groups(routing, 0, num_experts);

  Schedule schedule;
  schedule.world_size = world;
  schedule.num_experts = num_experts;
  schedule.tile_m = tile_m;
  for (int64_t rank = 0; rank < world; ++rank) {
    schedule.ranks.push_back(lay_out_rank(routing, groups, world, local_experts, tile_m, rank));
  }
  schedule.routes = invert(schedule.ranks, routing.tokens_per_rank * routing.top_k);
  return schedule;
}

RankSchedule build_rank_schedule(const Routing& routing, int64_t num_experts, int64_t tile_m,
                                 int64_t rank) {
  check_arguments(routing, num_experts, tile_m);
  CARACAL_CHECK(rank >= 0 && rank < routing.world_size, "schedule: rank must be in [0, world_size=",
                routing.world_size, "), got ", rank);
  const int64_t local_experts = num_experts / routing.world_size;
  const RouteGroups groups(routing, rank * local_experts, local_experts);
  return lay_out_rank(routing, groups, routing.world_size, local_experts, tile_m, rank);
}

}  // namespace caracal
