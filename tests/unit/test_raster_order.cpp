// The order of a row-tile GEMM's tiles within one expert, one CTA a tile or in CTA pairs
// (src/device/gemm/raster_order.hpp).
#include <gtest/gtest.h>

#include <set>
#include <utility>
#include <vector>

#include "device/gemm/raster_order.hpp"

namespace caracal::gemm {
namespace {

// Every tile once, in groups of `group_blocks` M blocks and one of the rest, each group's tiles N
// block by N block with M fastest. (n_blocks >= 2: with one N block the groups
// cannot be told apart, and the order is M block by M block.)
void expect_order(int blocks, int n_blocks, int group_blocks) {
  SCOPED_TRACE(::testing::Message() << blocks << " blocks, " << n_blocks << " N blocks, groups of <= " << group_blocks);
  std::set<std::pair<int, int>> seen;
  std::vector<int> widths;
  int group_start = 0;
  int t = 0;
  while (t < blocks * n_blocks) {
    const RasterPosition first = raster_position(t, blocks, n_blocks, group_blocks);
    ASSERT_EQ(first.m_block, group_start);
    ASSERT_EQ(first.n_block, 0);
    int width = 1;  // the group's width: its first N block's run of M blocks
    while (group_start + width < blocks && raster_position(t + width, blocks, n_blocks, group_blocks).n_block == 0) {
      ++width;
    }
    widths.push_back(width);
    for (int n = 0; n < n_blocks; ++n) {
      for (int m = 0; m < width; ++m, ++t) {
        const RasterPosition p = raster_position(t, blocks, n_blocks, group_blocks);
        ASSERT_EQ(p.m_block, group_start + m) << "tile " << t;
        ASSERT_EQ(p.n_block, n) << "tile " << t;
        ASSERT_TRUE(seen.insert({p.m_block, p.n_block}).second) << "tile " << t;
      }
    }
    group_start += width;
  }
  EXPECT_EQ(group_start, blocks);
  EXPECT_EQ(static_cast<int>(seen.size()), blocks * n_blocks);
  ASSERT_EQ(static_cast<int>(widths.size()), (blocks + group_blocks - 1) / group_blocks);
  for (size_t g = 0; g + 1 < widths.size(); ++g) EXPECT_EQ(widths[g], group_blocks);
  EXPECT_EQ(widths.back(), blocks % group_blocks != 0 ? blocks % group_blocks : group_blocks);
}

TEST(RasterOrder, EveryTileOnceInGroups) {
  for (int group_blocks : {1, 8, 16}) {
    for (int blocks = 1; blocks <= 70; ++blocks) {
      for (int n_blocks : {2, 7, 16, 28}) expect_order(blocks, n_blocks, group_blocks);
      for (int t = 0; t < blocks; ++t) EXPECT_EQ(raster_position(t, blocks, 1, group_blocks).m_block, t);
    }
  }
}

TEST(RasterOrder, NineBlocksAreEightAndOne) {
  // The order measured fastest with fixed-stride tiles (raster_order.hpp): 8 blocks N block by N
  // block, then the ninth alone.
  for (int t = 0; t < 8; ++t) EXPECT_EQ(raster_position(t, 9, 16, 8).m_block, t);
  EXPECT_EQ(raster_position(8, 9, 16, 8).m_block, 0);
  EXPECT_EQ(raster_position(8, 9, 16, 8).n_block, 1);
  EXPECT_EQ(raster_position(128, 9, 16, 8).m_block, 8);
  EXPECT_EQ(raster_position(143, 9, 16, 8).n_block, 15);
}

// CTA pairs: every tile of the expert once, as a pair's first or second tile; M-block pairs share
// the weights, only the odd last block pairs across N blocks, and only its last pair of an odd N
// count lacks a second tile.
TEST(PairOrder, EveryTileOnceInPairs) {
  for (int group_blocks : {1, 8, 16}) {
    for (int blocks = 1; blocks <= 40; ++blocks) {
      for (int n_blocks : {1, 2, 7, 8, 28}) {
        SCOPED_TRACE(::testing::Message() << blocks << " blocks, " << n_blocks << " N blocks, groups of " << group_blocks);
        std::set<std::pair<int, int>> seen;
        int singles = 0;
        const int pairs = expert_pairs(blocks, n_blocks);
        for (int t = 0; t < pairs; ++t) {
          const PairPosition p = pair_position(t, blocks, n_blocks, group_blocks);
          ASSERT_TRUE(seen.insert({p.m_block, p.n_block}).second) << "pair " << t;
          if (p.shares_rows) {
            ASSERT_EQ(p.m_block, blocks - 1) << "pair " << t;
            ASSERT_EQ(blocks % 2, 1) << "pair " << t;
            ASSERT_EQ(p.n_block % 2, 0) << "pair " << t;
          } else {
            ASSERT_EQ(p.m_block % 2, 0) << "pair " << t;
            ASSERT_TRUE(p.has_second) << "pair " << t;
          }
          if (!p.has_second) {
            ++singles;
            ASSERT_EQ(p.n_block, n_blocks - 1) << "pair " << t;
            continue;
          }
          const std::pair<int, int> second =
              p.shares_rows ? std::pair<int, int>{p.m_block, p.n_block + 1} : std::pair<int, int>{p.m_block + 1, p.n_block};
          ASSERT_LT(second.first, blocks);
          ASSERT_LT(second.second, n_blocks);
          ASSERT_TRUE(seen.insert(second).second) << "pair " << t;
        }
        EXPECT_EQ(static_cast<int>(seen.size()), blocks * n_blocks);
        EXPECT_EQ(singles, (blocks % 2) * (n_blocks % 2));
      }
    }
  }
}

TEST(PairOrder, MBlockPairsFollowTheRasterOrder) {
  // 16 blocks, 4 N blocks, groups of 8 blocks: 4 pairs (blocks 0-7) N block by N block, then the next 4.
  for (int t = 0; t < 4; ++t) {
    EXPECT_EQ(pair_position(t, 16, 4, 8).m_block, 2 * t);
    EXPECT_EQ(pair_position(t, 16, 4, 8).n_block, 0);
  }
  EXPECT_EQ(pair_position(4, 16, 4, 8).m_block, 0);
  EXPECT_EQ(pair_position(4, 16, 4, 8).n_block, 1);
  EXPECT_EQ(pair_position(16, 16, 4, 8).m_block, 8);
  // 3 blocks, 3 N blocks: the M-block pair (0, 1) at N 0-2, then block 2 at N (0, 1) and N 2 alone.
  EXPECT_EQ(expert_pairs(3, 3), 5);
  EXPECT_TRUE(pair_position(3, 3, 3, 8).shares_rows);
  EXPECT_EQ(pair_position(4, 3, 3, 8).n_block, 2);
  EXPECT_FALSE(pair_position(4, 3, 3, 8).has_second);
}

TEST(WeightPairOrder, EveryTileOnceInPairs) {
  for (int m_blocks = 1; m_blocks <= 57; ++m_blocks) {
    for (int n_blocks : {1, 2, 7, 28}) {
      SCOPED_TRACE(::testing::Message() << m_blocks << " M blocks, " << n_blocks << " N blocks");
      std::set<std::pair<int, int>> seen;
      const int pairs = weight_expert_pairs(m_blocks, n_blocks);
      for (int t = 0; t < pairs; ++t) {
        const PairPosition p = weight_pair_position(t, m_blocks, n_blocks);
        ASSERT_FALSE(p.shares_rows) << "pair " << t;
        ASSERT_EQ(p.m_block % 2, 0) << "pair " << t;
        ASSERT_LT(p.n_block, n_blocks) << "pair " << t;
        ASSERT_TRUE(seen.insert({p.m_block, p.n_block}).second) << "pair " << t;
        if (!p.has_second) {
          ASSERT_EQ(p.m_block, m_blocks - 1) << "pair " << t;  // only an odd count's last block
          continue;
        }
        ASSERT_LT(p.m_block + 1, m_blocks);
        ASSERT_TRUE(seen.insert({p.m_block + 1, p.n_block}).second) << "pair " << t;
      }
      EXPECT_EQ(static_cast<int>(seen.size()), m_blocks * n_blocks);
    }
  }
}

TEST(WeightPairOrder, NBlocksFastest) {
  // 4 M blocks, 3 N blocks: pairs (0, 1) at N 0, 1, 2, then (2, 3) at N 0, 1, 2.
  EXPECT_EQ(weight_expert_pairs(4, 3), 6);
  EXPECT_EQ(weight_pair_position(2, 4, 3).m_block, 0);
  EXPECT_EQ(weight_pair_position(2, 4, 3).n_block, 2);
  EXPECT_EQ(weight_pair_position(3, 4, 3).m_block, 2);
  EXPECT_EQ(weight_pair_position(3, 4, 3).n_block, 0);
  // 5 M blocks: block 4 alone at every N block.
  EXPECT_EQ(weight_expert_pairs(5, 3), 9);
  EXPECT_FALSE(weight_pair_position(8, 5, 3).has_second);
  EXPECT_EQ(weight_pair_position(8, 5, 3).m_block, 4);
}

}  // namespace
}  // namespace caracal::gemm
