#pragma once
// Host twin of the schedule table (DESIGN §2): the same placement rule the GPU builder uses, in
// plain C++. It is the oracle for the GPU builder and the engine of the planner.
//
// For receiving rank r (holding experts [r*L, (r+1)*L), L = E / W):
//   * rows are expert-contiguous: local expert e's segment starts at expert_offset[e], holds
//     expert_count[e] routes and is padded with empty rows to a multiple of tile_m;
//   * inside a segment the sources are interleaved round-robin: the j-th route (in (token, slot)
//     order) from source p, with c_q routes from each source q, lands at
//         expert_offset[e] + sum_q min(c_q, j) + #{q < p : c_q > j};
//   * a row holds {src_rank, src_route = token * k + slot}; padding rows hold src_rank = -1.
// Placement is a pure function of the routing: identical on every call.
#include <cstdint>
#include <vector>

#include "caracal/routing.hpp"

namespace caracal {

struct ScheduleRow {
  int32_t src_rank = -1;   // home rank of the token; -1 marks a padding row
  int32_t src_route = -1;  // token * top_k + slot on the home rank
  bool is_padding() const { return src_rank < 0; }
  friend bool operator==(const ScheduleRow& a, const ScheduleRow& b) {
    return a.src_rank == b.src_rank && a.src_route == b.src_route;
  }
};

// A token row of a receiving rank: a token of home rank src_rank with at least one route to the
// receiving rank's experts. The fused kernels (DESIGN §2) move one row per (token, rank): the
// token is pulled once and its expert rows are read from that copy, and the rank's outputs for
// it go home as one summed row.
struct TokenRow {
  int32_t src_rank = -1;
  int32_t token = -1;
  friend bool operator==(const TokenRow& a, const TokenRow& b) {
    return a.src_rank == b.src_rank && a.token == b.token;
  }
};

// What one receiving rank holds.
struct RankSchedule {
  std::vector<ScheduleRow> rows;        // padded, expert-contiguous; size = expert_offset.back()
  std::vector<int64_t> expert_offset;   // [L + 1] first row of each local expert's segment
  std::vector<int64_t> expert_count;    // [L] real routes per local expert
  std::vector<int64_t> source_count;    // [L][W] routes per (local expert, source rank)
  // The token rows, sources dealt round-robin as inside a segment (the j-th token of source p, with
  // t_q tokens from each source q, at sum_q min(t_q, j) + #{q < p : t_q > j}), each source's tokens
  // ascending; and for every row the token row it reads (-1 for a padding row).
  std::vector<TokenRow> token_rows;
  std::vector<int32_t> row_token;       // [padded rows]
  int64_t routes() const;               // sum of expert_count
  int64_t padded_rows() const { return expert_offset.empty() ? 0 : expert_offset.back(); }
};

// Where one route of a home rank is processed: the inverse view used by combine and by the
// backward transfers. dst_rank = -1 for an empty (-1) slot.
struct RouteLocation {
  int32_t dst_rank = -1;
  int32_t row = -1;
  friend bool operator==(const RouteLocation& a, const RouteLocation& b) {
    return a.dst_rank == b.dst_rank && a.row == b.row;
  }
};

struct Schedule {
  int64_t world_size = 0;
  int64_t num_experts = 0;
  int64_t tile_m = 0;
  std::vector<RankSchedule> ranks;                  // [W] by receiving rank
  std::vector<std::vector<RouteLocation>> routes;   // [W home rank][T * k]
};

// Throws caracal::Error if tile_m < 1, num_experts is not divisible by the world size, or the
// routing holds an id outside [-1, num_experts).
Schedule build_schedule(const Routing& routing, int64_t num_experts, int64_t tile_m);

// One receiving rank only (what the GPU builder computes on each rank).
RankSchedule build_rank_schedule(const Routing& routing, int64_t num_experts, int64_t tile_m,
                                 int64_t rank);

}  // namespace caracal
