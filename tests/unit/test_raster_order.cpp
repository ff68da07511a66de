// The order of a row-tile GEMM's tiles within one expert (src/device/gemm/raster_order.hpp).
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

}  // namespace
}  // namespace caracal::gemm
