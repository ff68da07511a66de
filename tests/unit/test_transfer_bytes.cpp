// caracal_transfer_bench's byte counts (bench/transfer/transfer_bytes.hpp) on a routing small enough to
// count by hand: two ranks of two experts, two tokens per rank, three slots.
#include <gtest/gtest.h>

#include <vector>

#include "caracal/routing.hpp"
#include "caracal/transfer/exchange_shape.hpp"
#include "transfer_bytes.hpp"

namespace caracal::bench {
namespace {

// Experts 0, 1 live on rank 0, experts 2, 3 on rank 1.
Routing hand_routing() {
  Routing r;
  r.world_size = 2;
  r.tokens_per_rank = 2;
  r.top_k = 3;
  r.topk_idx = {0, 2, 3,  1, -1, 0,     // rank 0: token 0 on both ranks, token 1 on rank 0 only
                2, 3, 1,  -1, -1, -1};  // rank 1: token 0 on both ranks, token 1 nowhere
  return r;
}

constexpr transfer::ExchangeShape kShape{2, 3, 8, 4, 4};  // T, k, D, E, tile_m
constexpr double kRow = 2 * 8;                            // bytes of a row

RowTraffic traffic(bool rows_per_route) {
  const Routing r = hand_routing();
  return traffic_of(r, kShape, schedule_rows_per_rank(r, kShape.num_experts, kShape.tile_m), rows_per_route);
}

TEST(TransferBytes, CountsRoutesTokenRowsAndPadding) {
  const RowTraffic t = traffic(false);
  EXPECT_EQ(t.routed, 8);
  EXPECT_EQ(t.pulled_tokens, 5);  // (home, token, rank): 2 + 1 + 2 + 0
  EXPECT_EQ(t.padded_rows, 16);   // every expert has 2 routes, padded to 4
  EXPECT_EQ(t.tokens, 4);
  EXPECT_EQ(t.remote_pulled, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(t.remote_pulled_tokens, (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(t.remote_pushed, (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(t.remote_pushed_tokens, (std::vector<int64_t>{1, 1}));  // token 0 of each rank, to the other
}

TEST(TransferBytes, PullsAndCombineCountOneRowPerTokenAndRankOrPerRoute) {
  const RowTraffic per_token = traffic(false);
  const RowTraffic per_route = traffic(true);
  EXPECT_DOUBLE_EQ(bytes_moved(Pass::kDispatch, per_token), (5 + 16) * kRow);
  EXPECT_DOUBLE_EQ(bytes_moved(Pass::kReverseCombine, per_token), (5 + 16) * kRow);
  EXPECT_DOUBLE_EQ(bytes_moved(Pass::kDispatch, per_route), (8 + 16) * kRow);
  EXPECT_EQ(remote_bytes_per_rank(Pass::kDispatch, per_token), (std::vector<double>{kRow, kRow}));
  EXPECT_EQ(remote_bytes_per_rank(Pass::kDispatch, per_route), (std::vector<double>{kRow, 2 * kRow}));
  // combine reads every routed row and pushes (then sums) a row per (token, rank) or per route.
  EXPECT_DOUBLE_EQ(bytes_moved(Pass::kCombine, per_token), (8 + 2 * 5 + 4) * kRow);
  EXPECT_DOUBLE_EQ(bytes_moved(Pass::kCombine, per_route), (3 * 8 + 4) * kRow);
  EXPECT_EQ(remote_bytes_per_rank(Pass::kCombine, per_token), (std::vector<double>{kRow, kRow}));
  EXPECT_EQ(remote_bytes_per_rank(Pass::kCombine, per_route), (std::vector<double>{2 * kRow, kRow}));
  // reverse dispatch pushes a row per route either way.
  for (const RowTraffic& t : {per_token, per_route}) {
    EXPECT_DOUBLE_EQ(bytes_moved(Pass::kReverseDispatch, t), (3 * 8 + 4) * kRow);
    EXPECT_EQ(remote_bytes_per_rank(Pass::kReverseDispatch, t), (std::vector<double>{2 * kRow, kRow}));
  }
}

// In a world of one rank every transfer goes by token: the pulls read a token once even per route,
// and combine and reverse dispatch read each routed row and write a row per token, in one pass.
TEST(TransferBytes, OneRankCountsOnePassAndOneReadPerToken) {
  Routing r;
  r.world_size = 1;
  r.tokens_per_rank = 2;
  r.top_k = 3;
  r.topk_idx = {0, 2, 3, 1, -1, 0};  // token 0: three routes; token 1: two and an empty slot
  const transfer::ExchangeShape shape{2, 3, 8, 4, 4};
  for (bool rows_per_route : {false, true}) {
    const RowTraffic t = traffic_of(r, shape, schedule_rows_per_rank(r, shape.num_experts, shape.tile_m), rows_per_route);
    EXPECT_TRUE(t.single_rank);
    EXPECT_EQ(t.routed, 5);
    EXPECT_EQ(t.pulled_tokens, 2);
    EXPECT_EQ(t.padded_rows, 16);  // four experts with 2, 1, 1, 1 routes, each padded to 4
    EXPECT_DOUBLE_EQ(bytes_moved(Pass::kDispatch, t), (2 + 16) * kRow);
    EXPECT_DOUBLE_EQ(bytes_moved(Pass::kReverseCombine, t), (2 + 16) * kRow);
    EXPECT_DOUBLE_EQ(bytes_moved(Pass::kCombine, t), (5 + 2) * kRow);
    EXPECT_DOUBLE_EQ(bytes_moved(Pass::kReverseDispatch, t), (5 + 2) * kRow);
    EXPECT_EQ(remote_bytes_per_rank(Pass::kCombine, t), (std::vector<double>{0.0}));
  }
}

}  // namespace
}  // namespace caracal::bench
