#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "caracal/error.hpp"
#include "caracal/routing.hpp"
#include "caracal/schedule.hpp"

namespace caracal {
namespace {

using Row = ScheduleRow;
using Loc = RouteLocation;

void expect_error(const std::function<void()>& fn, const std::string& mention) {
  try {
    fn();
    ADD_FAILURE() << "expected caracal::Error mentioning '" << mention << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(mention), std::string::npos) << e.what();
  }
}

bool same_rank_schedule(const RankSchedule& a, const RankSchedule& b) {
  return a.rows == b.rows && a.expert_offset == b.expert_offset && a.expert_count == b.expert_count &&
         a.source_count == b.source_count && a.token_rows == b.token_rows && a.row_token == b.row_token;
}

// The token rows of receiving rank `rank` by the formula: source p's tokens with a route to one of
// the rank's experts, ascending; the j-th of them at sum_q min(t_q, j) + #{q < p : t_q > j}.
std::vector<TokenRow> expected_token_rows(const Routing& routing, int64_t num_experts, int64_t rank) {
  const int64_t W = routing.world_size, T = routing.tokens_per_rank, k = routing.top_k;
  const int64_t L = num_experts / W;
  std::vector<std::vector<int32_t>> sent(static_cast<size_t>(W));
  for (int64_t p = 0; p < W; ++p) {
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t s = 0; s < k; ++s) {
        const int32_t e = routing.at(p, t, s);
        if (e >= 0 && e / L == rank) {
          sent[p].push_back(static_cast<int32_t>(t));
          break;
        }
      }
    }
  }
  size_t total = 0;
  for (const auto& tokens : sent) total += tokens.size();
  std::vector<TokenRow> rows(total);
  for (int64_t p = 0; p < W; ++p) {
    for (int64_t j = 0; j < static_cast<int64_t>(sent[p].size()); ++j) {
      int64_t at = 0;
      for (int64_t q = 0; q < W; ++q) {
        const int64_t c = static_cast<int64_t>(sent[q].size());
        at += std::min(c, j) + (q < p && c > j ? 1 : 0);
      }
      rows[static_cast<size_t>(at)] = {static_cast<int32_t>(p), sent[p][j]};
    }
  }
  return rows;
}

int64_t round_up(int64_t value, int64_t multiple) { return (value + multiple - 1) / multiple * multiple; }

// ---- The oracle: the placement formula of DESIGN §2, evaluated literally -------------------
// For receiving rank r and local expert e: collect each source's routes in (token, slot) order,
// then put the j-th route of source p at base + sum_q min(c_q, j) + #{q < p : c_q > j}. O(W)
// per route, written independently of the builder's card dealing.
struct ExpectedRank {
  std::vector<Row> rows;
  std::vector<int64_t> expert_offset;
  std::vector<int64_t> source_count;
};

ExpectedRank expected_rank(const Routing& routing, int64_t num_experts, int64_t tile_m, int64_t rank) {
  const int64_t W = routing.world_size, T = routing.tokens_per_rank, k = routing.top_k;
  const int64_t L = num_experts / W;
  ExpectedRank out;
  out.expert_offset.push_back(0);
  for (int64_t e = 0; e < L; ++e) {
    const int32_t expert = static_cast<int32_t>(rank * L + e);
    std::vector<std::vector<int32_t>> from(static_cast<size_t>(W));  // routes per source
    for (int64_t p = 0; p < W; ++p) {
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t s = 0; s < k; ++s) {
          if (routing.at(p, t, s) == expert) from[p].push_back(static_cast<int32_t>(t * k + s));
        }
      }
      out.source_count.push_back(static_cast<int64_t>(from[p].size()));
    }
    int64_t count = 0;
    for (const auto& routes : from) count += static_cast<int64_t>(routes.size());
    const int64_t base = out.expert_offset.back();
    out.rows.resize(static_cast<size_t>(base + round_up(count, tile_m)));
    for (int64_t p = 0; p < W; ++p) {
      for (int64_t j = 0; j < static_cast<int64_t>(from[p].size()); ++j) {
        int64_t row = base;
        for (int64_t q = 0; q < W; ++q) {
          const int64_t c = static_cast<int64_t>(from[q].size());
          row += std::min(c, j) + (q < p && c > j ? 1 : 0);
        }
        out.rows[row] = {static_cast<int32_t>(p), from[p][j]};
      }
    }
    out.expert_offset.push_back(static_cast<int64_t>(out.rows.size()));
  }
  return out;
}

// ---- Properties every schedule must have ---------------------------------------------------
void check_schedule(const Routing& routing, int64_t num_experts, int64_t tile_m) {
  const int64_t W = routing.world_size, T = routing.tokens_per_rank, k = routing.top_k;
  const int64_t L = num_experts / W;
  const Schedule schedule = build_schedule(routing, num_experts, tile_m);
  ASSERT_EQ(schedule.world_size, W);
  ASSERT_EQ(schedule.num_experts, num_experts);
  ASSERT_EQ(schedule.tile_m, tile_m);
  ASSERT_EQ(static_cast<int64_t>(schedule.ranks.size()), W);
  ASSERT_EQ(static_cast<int64_t>(schedule.routes.size()), W);

  // times_placed[home][route]: how many rows hold that route.
  std::vector<std::vector<int>> times_placed(W, std::vector<int>(static_cast<size_t>(T * k), 0));
  for (int64_t r = 0; r < W; ++r) {
    SCOPED_TRACE("receiving rank " + std::to_string(r));
    const RankSchedule& rs = schedule.ranks[r];
    ASSERT_EQ(static_cast<int64_t>(rs.expert_offset.size()), L + 1);
    ASSERT_EQ(static_cast<int64_t>(rs.expert_count.size()), L);
    ASSERT_EQ(static_cast<int64_t>(rs.source_count.size()), L * W);
    ASSERT_EQ(rs.expert_offset.front(), 0);
    ASSERT_EQ(static_cast<int64_t>(rs.rows.size()), rs.padded_rows());
    int64_t routes = 0;
    for (int64_t e = 0; e < L; ++e) {
      const int64_t begin = rs.expert_offset[e], count = rs.expert_count[e];
      // Segments: contiguous, tile-aligned, real rows first, then only padding to the tile.
      EXPECT_EQ(begin % tile_m, 0);
      EXPECT_EQ(rs.expert_offset[e + 1] - begin, round_up(count, tile_m));
      int64_t from_sources = 0;
      for (int64_t p = 0; p < W; ++p) from_sources += rs.source_count[e * W + p];
      EXPECT_EQ(from_sources, count);
      std::vector<int32_t> last_route(static_cast<size_t>(W), -1);
      for (int64_t row = begin; row < rs.expert_offset[e + 1]; ++row) {
        const Row& x = rs.rows[row];
        if (row >= begin + count) {
          EXPECT_EQ(x, (Row{-1, -1})) << "row " << row << " should be padding";
          continue;
        }
        ASSERT_GE(x.src_rank, 0) << "row " << row;
        ASSERT_LT(x.src_rank, W);
        ASSERT_GE(x.src_route, 0);
        ASSERT_LT(x.src_route, T * k);
        // The row's route really goes to this segment's expert.
        EXPECT_EQ(routing.rank_topk(x.src_rank)[x.src_route], r * L + e) << "row " << row;
        // Routes of one source keep their (token, slot) order.
        EXPECT_GT(x.src_route, last_route[x.src_rank]) << "row " << row;
        last_route[x.src_rank] = x.src_route;
        ++times_placed[x.src_rank][x.src_route];
        // The inverse view points back at this row.
        EXPECT_EQ(schedule.routes[x.src_rank][x.src_route], (Loc{static_cast<int32_t>(r), static_cast<int32_t>(row)}));
      }
      routes += count;
    }
    EXPECT_EQ(rs.routes(), routes);

    // The exact table, against the formula.
    const ExpectedRank expected = expected_rank(routing, num_experts, tile_m, r);
    EXPECT_EQ(rs.expert_offset, expected.expert_offset);
    EXPECT_EQ(rs.source_count, expected.source_count);
    EXPECT_EQ(rs.rows, expected.rows);

    // One token row per (token, this rank), and every row reads its own token's.
    EXPECT_EQ(rs.token_rows, expected_token_rows(routing, num_experts, r));
    ASSERT_EQ(rs.row_token.size(), rs.rows.size());
    for (size_t row = 0; row < rs.rows.size(); ++row) {
      if (rs.rows[row].is_padding()) {
        EXPECT_EQ(rs.row_token[row], -1) << "row " << row;
        continue;
      }
      ASSERT_GE(rs.row_token[row], 0) << "row " << row;
      ASSERT_LT(rs.row_token[row], static_cast<int32_t>(rs.token_rows.size()));
      EXPECT_EQ(rs.token_rows[static_cast<size_t>(rs.row_token[row])],
                (TokenRow{rs.rows[row].src_rank, static_cast<int32_t>(rs.rows[row].src_route / k)}))
          << "row " << row;
    }

    // One rank alone gives the same table (what each GPU computes).
    EXPECT_TRUE(same_rank_schedule(build_rank_schedule(routing, num_experts, tile_m, r), rs));
  }

  // Every valid route appears exactly once; empty slots nowhere, and their inverse is {-1, -1}.
  for (int64_t home = 0; home < W; ++home) {
    for (int64_t route = 0; route < T * k; ++route) {
      const int32_t expert = routing.rank_topk(home)[route];
      EXPECT_EQ(times_placed[home][route], expert >= 0 ? 1 : 0) << "home " << home << " route " << route;
      if (expert < 0) {
        EXPECT_EQ(schedule.routes[home][route], (Loc{-1, -1}));
      } else {
        EXPECT_EQ(schedule.routes[home][route].dst_rank, expert / L);
      }
    }
  }

  // A pure function of the routing.
  const Schedule again = build_schedule(routing, num_experts, tile_m);
  for (int64_t r = 0; r < W; ++r) EXPECT_TRUE(same_rank_schedule(again.ranks[r], schedule.ranks[r]));
  EXPECT_EQ(again.routes, schedule.routes);
}

// ---- Routings, random and adversarial ------------------------------------------------------
enum class Pattern {
  kUniform,
  kZipf,
  kAllToOne,        // every slot to the last expert
  kAnySlot,         // each slot independently any expert or -1: duplicates within tokens
  kSilentRank,      // rank 0's tokens are all empty slots
  kIdleRank,        // nobody routes to the last rank's experts
  kAllEmpty,        // every slot -1
  kOneSourceFloods, // rank 0 sends everything to expert 0, the others spread thinly
};

const char* name(Pattern p) {
  switch (p) {
    case Pattern::kUniform: return "uniform";
    case Pattern::kZipf: return "zipf";
    case Pattern::kAllToOne: return "all-to-one";
    case Pattern::kAnySlot: return "any-slot";
    case Pattern::kSilentRank: return "silent-rank";
    case Pattern::kIdleRank: return "idle-rank";
    case Pattern::kAllEmpty: return "all-empty";
    case Pattern::kOneSourceFloods: return "one-source-floods";
  }
  return "?";
}

constexpr Pattern kPatterns[] = {Pattern::kUniform,   Pattern::kZipf,       Pattern::kAllToOne,
                                 Pattern::kAnySlot,   Pattern::kSilentRank, Pattern::kIdleRank,
                                 Pattern::kAllEmpty,  Pattern::kOneSourceFloods};

Routing make_pattern(Pattern pattern, int64_t W, int64_t T, int64_t k, int64_t E, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const auto any = [&](int64_t lo, int64_t hi) {  // uniform in [lo, hi]
    return static_cast<int32_t>(std::uniform_int_distribution<int64_t>(lo, hi)(rng));
  };
  RoutingSpec spec;
  spec.seed = seed;
  spec.empty_slot_fraction = seed % 2 ? 0.15 : 0.0;
  switch (pattern) {
    case Pattern::kUniform:
      return make_routing(spec, W, T, k, E);
    case Pattern::kZipf:
      spec.kind = RoutingKind::kZipf;
      spec.zipf_exponent = 1.5;
      return make_routing(spec, W, T, k, E);
    case Pattern::kAllToOne:
      spec.kind = RoutingKind::kAllToOne;
      spec.target_expert = static_cast<int32_t>(E - 1);
      return make_routing(spec, W, T, k, E);
    default:
      break;
  }
  Routing r;
  r.world_size = W;
  r.tokens_per_rank = T;
  r.top_k = k;
  r.topk_idx.resize(static_cast<size_t>(W * T * k));
  const int64_t L = E / W;
  for (int64_t p = 0; p < W; ++p) {
    for (int64_t i = 0; i < T * k; ++i) {
      int32_t& id = r.topk_idx[p * T * k + i];
      switch (pattern) {
        case Pattern::kAnySlot: id = any(-1, E - 1); break;
        case Pattern::kSilentRank: id = p == 0 ? -1 : any(-1, E - 1); break;
        case Pattern::kIdleRank: id = W == 1 ? -1 : any(-1, E - L - 1); break;
        case Pattern::kAllEmpty: id = -1; break;
        case Pattern::kOneSourceFloods: id = p == 0 ? 0 : (any(0, 9) == 0 ? any(0, E - 1) : -1); break;
        default: break;
      }
    }
  }
  return r;
}

TEST(Schedule, PropertiesHoldOnRandomAndAdversarialRoutings) {
  const uint64_t base_seed = (uint64_t{std::random_device{}()} << 32) | std::random_device{}();
  SCOPED_TRACE("base seed " + std::to_string(base_seed) + " (Pattern seeds derive from it)");
  struct Shape {
    int64_t W, T, k, L;
  };
  const Shape shapes[] = {{1, 40, 4, 8}, {2, 37, 3, 3}, {4, 25, 8, 4}, {8, 16, 2, 1}, {8, 9, 5, 2}, {64, 6, 4, 2}};
  uint64_t seed = base_seed;
  for (const Shape& s : shapes) {
    for (const Pattern pattern : kPatterns) {
      for (const int64_t tile_m : {1, 3, 4, 128}) {
        ++seed;
        SCOPED_TRACE(std::string(name(pattern)) + " W=" + std::to_string(s.W) + " T=" + std::to_string(s.T) +
                     " k=" + std::to_string(s.k) + " E=" + std::to_string(s.W * s.L) +
                     " tile_m=" + std::to_string(tile_m) + " seed=" + std::to_string(seed));
        const Routing routing = make_pattern(pattern, s.W, s.T, s.k, s.W * s.L, seed);
        check_schedule(routing, s.W * s.L, tile_m);
        if (HasFailure()) return;  // one failing case is enough to read
      }
    }
  }
}

TEST(Schedule, PropertiesHoldOnRandomShapes) {
  const uint64_t seed = (uint64_t{std::random_device{}()} << 32) | std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const auto pick = [&](auto const& options) { return options[rng() % std::size(options)]; };
  const int64_t worlds[] = {1, 2, 4, 8, 64};
  const int64_t tiles[] = {1, 2, 3, 5, 7, 16, 128};
  for (int iteration = 0; iteration < 300; ++iteration) {
    const int64_t W = pick(worlds), tile_m = pick(tiles);
    const int64_t L = 1 + static_cast<int64_t>(rng() % 5);
    const int64_t T = 1 + static_cast<int64_t>(rng() % (W == 64 ? 8 : 50));
    const int64_t k = 1 + static_cast<int64_t>(rng() % std::min<int64_t>(9, W * L));
    const Pattern pattern = pick(kPatterns);
    const uint64_t routing_seed = rng();
    SCOPED_TRACE(std::string(name(pattern)) + " W=" + std::to_string(W) + " T=" + std::to_string(T) +
                 " k=" + std::to_string(k) + " E=" + std::to_string(W * L) + " tile_m=" +
                 std::to_string(tile_m) + " routing seed=" + std::to_string(routing_seed));
    check_schedule(make_pattern(pattern, W, T, k, W * L, routing_seed), W * L, tile_m);
    if (HasFailure()) return;
  }
}

TEST(Schedule, FixedSeedsAreReproducible) {
  // The deterministic counterpart of the randomized test above.
  for (uint64_t seed : {1u, 2u, 3u}) {
    const Routing routing = make_pattern(Pattern::kZipf, 4, 64, 8, 32, seed);
    const Schedule a = build_schedule(routing, 32, 16);
    const Schedule b = build_schedule(make_pattern(Pattern::kZipf, 4, 64, 8, 32, seed), 32, 16);
    for (size_t r = 0; r < 4; ++r) EXPECT_TRUE(same_rank_schedule(a.ranks[r], b.ranks[r]));
    EXPECT_EQ(a.routes, b.routes);
    check_schedule(routing, 32, 16);
  }
}

// W=2, E=4 (2 local experts per rank), T=3, k=2, tile_m=4. Routes are token * 2 + slot.
//   rank 0: token 0 -> {0, 2}, token 1 -> {1, 0}, token 2 -> {-1, 3}
//   rank 1: token 0 -> {0, 1}, token 1 -> {0, 0}, token 2 -> {2, -1}
TEST(Schedule, HandWrittenExample) {
  Routing routing;
  routing.world_size = 2;
  routing.tokens_per_rank = 3;
  routing.top_k = 2;
  routing.topk_idx = {0, 2, 1, 0, -1, 3,  // rank 0
                      0, 1, 0, 0, 2, -1};  // rank 1
  const Schedule s = build_schedule(routing, 4, 4);
  const Row pad{-1, -1};

  // Rank 0, expert 0: source 0 sends routes 0, 3; source 1 sends 0, 2, 3 (a duplicate within
  // token 1). Dealt round-robin: (0,0) (1,0) | (0,3) (1,2) | (1,3), then 3 padding rows.
  // Expert 1: source 0 route 2, source 1 route 1, then 2 padding rows.
  const RankSchedule& r0 = s.ranks[0];
  EXPECT_EQ(r0.expert_offset, (std::vector<int64_t>{0, 8, 12}));
  EXPECT_EQ(r0.expert_count, (std::vector<int64_t>{5, 2}));
  EXPECT_EQ(r0.source_count, (std::vector<int64_t>{2, 3, 1, 1}));
  EXPECT_EQ(r0.rows, (std::vector<Row>{{0, 0}, {1, 0}, {0, 3}, {1, 2}, {1, 3}, pad, pad, pad,
                                       {0, 2}, {1, 1}, pad, pad}));
  EXPECT_EQ(r0.routes(), 7);
  EXPECT_EQ(r0.padded_rows(), 12);

  // Rank 1, expert 2: source 0 route 1, source 1 route 4. Expert 3: source 0 route 5.
  const RankSchedule& r1 = s.ranks[1];
  EXPECT_EQ(r1.expert_offset, (std::vector<int64_t>{0, 4, 8}));
  EXPECT_EQ(r1.expert_count, (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(r1.source_count, (std::vector<int64_t>{1, 1, 1, 0}));
  EXPECT_EQ(r1.rows, (std::vector<Row>{{0, 1}, {1, 4}, pad, pad, {0, 5}, pad, pad, pad}));

  // Inverse view: where each (token, slot) of each home rank went.
  EXPECT_EQ(s.routes[0], (std::vector<Loc>{{0, 0}, {1, 0}, {0, 8}, {0, 2}, {-1, -1}, {1, 4}}));
  EXPECT_EQ(s.routes[1], (std::vector<Loc>{{0, 1}, {0, 9}, {0, 3}, {0, 4}, {1, 1}, {-1, -1}}));

  // Token rows: rank 0 gets tokens 0, 1 of source 0 and tokens 0, 1 of source 1 (token 1 of
  // source 1 twice, one row), dealt (0,0) (1,0) (0,1) (1,1); rank 1 gets source 0's tokens 0, 2
  // and source 1's token 2.
  EXPECT_EQ(r0.token_rows, (std::vector<TokenRow>{{0, 0}, {1, 0}, {0, 1}, {1, 1}}));
  EXPECT_EQ(r0.row_token, (std::vector<int32_t>{0, 1, 2, 3, 3, -1, -1, -1, 2, 1, -1, -1}));
  EXPECT_EQ(r1.token_rows, (std::vector<TokenRow>{{0, 0}, {1, 2}, {0, 2}}));
  EXPECT_EQ(r1.row_token, (std::vector<int32_t>{0, 1, -1, -1, 2, -1, -1, -1}));
}

TEST(Schedule, UnevenSourcesInterleaveThenRunOut) {
  // One expert (W=3, E=3, rank 0 holds expert 0); sources send 1, 4 and 2 routes.
  // Round 0: s0 s1 s2 | round 1: s1 s2 | rounds 2, 3: s1.
  Routing routing;
  routing.world_size = 3;
  routing.tokens_per_rank = 4;
  routing.top_k = 1;
  routing.topk_idx = {-1, 0, 1, 2,  // rank 0 -> expert 0 once (route 1)
                      0, 0, 0, 0,   // rank 1 -> expert 0 four times
                      0, 2, 1, 0};  // rank 2 -> expert 0 at routes 0 and 3
  const RankSchedule rs = build_rank_schedule(routing, 3, 1, 0);
  EXPECT_EQ(rs.rows, (std::vector<Row>{{0, 1}, {1, 0}, {2, 0}, {1, 1}, {2, 3}, {1, 2}, {1, 3}}));
}

TEST(Schedule, AllRoutesToOneExpertAtScale) {
  // The worst case of DESIGN §2: everything of every rank lands on one expert, nothing dropped.
  RoutingSpec spec;
  spec.kind = RoutingKind::kAllToOne;
  spec.target_expert = 77;
  const Routing routing = make_routing(spec, 16, 512, 8, 128);
  const Schedule s = build_schedule(routing, 128, 128);
  const RankSchedule& hot = s.ranks[77 / 8];
  EXPECT_EQ(hot.expert_count[77 % 8], 16 * 512 * 8);
  EXPECT_EQ(hot.padded_rows(), 16 * 512 * 8);  // already a multiple of 128
  for (size_t r = 0; r < s.ranks.size(); ++r) {
    if (r != 77 / 8) {
      EXPECT_EQ(s.ranks[r].padded_rows(), 0);
    }
  }
  // Round-robin: consecutive rows come from consecutive sources.
  for (int64_t row = 0; row < 64; ++row) {
    EXPECT_EQ(hot.rows[hot.expert_offset[77 % 8] + row], (Row{static_cast<int32_t>(row % 16), static_cast<int32_t>(row / 16)}));
  }
  // One token row per token of every rank (its 8 routes share it), sources dealt round-robin.
  ASSERT_EQ(hot.token_rows.size(), size_t{16 * 512});
  for (int32_t i = 0; i < 64; ++i) EXPECT_EQ(hot.token_rows[static_cast<size_t>(i)], (TokenRow{i % 16, i / 16}));
}

TEST(Schedule, RejectsBadArguments) {
  const Routing routing = make_pattern(Pattern::kUniform, 4, 8, 2, 16, 0);
  for (const int64_t tile_m : {0, -1}) {
    expect_error([&] { build_schedule(routing, 16, tile_m); }, "tile_m");
    expect_error([&] { build_rank_schedule(routing, 16, tile_m, 0); }, "tile_m");
  }
  expect_error([&] { build_schedule(make_pattern(Pattern::kUniform, 4, 8, 2, 6, 0), 6, 4); }, "divisible by the world size (4)");
  expect_error([&] { build_schedule(routing, 8, 4); }, "outside [-1, num_experts=8)");  // ids up to 15
  Routing bad = routing;
  bad.topk_idx[5] = -3;
  expect_error([&] { build_schedule(bad, 16, 4); }, "-3");
  bad.topk_idx.pop_back();
  expect_error([&] { build_schedule(bad, 16, 4); }, "entries");
  expect_error([&] { build_rank_schedule(routing, 16, 4, 4); }, "rank must be in [0, world_size=4)");
  expect_error([&] { build_rank_schedule(routing, 16, 4, -1); }, "rank must be in");
}

}  // namespace
}  // namespace caracal
