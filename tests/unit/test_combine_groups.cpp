// The host twin of combine per (token, rank) (caracal/combine_groups.hpp), on tokens small enough to
// work out by hand: which slot leads each group (the lowest row of a token's routes on one rank and
// window), and the row the home gets (each group rounded to bf16 once, the groups added in their
// leaders' slot order onto the shared row, rounded once).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "caracal/bf16.hpp"
#include "caracal/combine_groups.hpp"
#include "caracal/error.hpp"

namespace caracal {
namespace {

TEST(CombineGroups, LeaderIsTheLowestRowOfItsRankAndWindow) {
  // Slots 0 and 2 on rank 1 (rows 40, 7), slot 1 on rank 0, slot 3 unrouted, slot 4 on rank 1
  // row 300.
  const std::vector<SlotPlace> slots = {{true, 1, 40}, {true, 0, 12}, {true, 1, 7}, {}, {true, 1, 300}};
  EXPECT_EQ(combine_group_leaders(slots, /*group_rows=*/0, false), (std::vector<int>{2, 1, 2, -1, 2}));
  // Windows of 128 rows: row 300 is a group of its own; rows 40 and 7 share window 0.
  EXPECT_EQ(combine_group_leaders(slots, 128, false), (std::vector<int>{2, 1, 2, -1, 4}));
  // Windows of 32 rows: rows 40 and 7 fall apart too.
  EXPECT_EQ(combine_group_leaders(slots, 32, false), (std::vector<int>{0, 1, 2, -1, 4}));
  // Per route: every routed slot leads itself.
  EXPECT_EQ(combine_group_leaders(slots, 0, true), (std::vector<int>{0, 1, 2, -1, 4}));
}

TEST(CombineGroups, AllUnroutedGivesNoGroup) {
  EXPECT_EQ(combine_group_leaders({{}, {}}, 0, false), (std::vector<int>{-1, -1}));
}

TEST(CombineGroups, RoundsEachGroupOnceThenTheSum) {
  // Three slots: 0 and 2 on rank 0 (one group led by slot 2's lower row), 1 on rank 1.
  const std::vector<SlotPlace> slots = {{true, 0, 9}, {true, 1, 3}, {true, 0, 4}};
  const std::vector<float> gates = {0.3f, 0.5f, 0.7f};
  const std::vector<uint16_t> r0 = {bf16_bits(1.0078125f), bf16_bits(-3.0f)};
  const std::vector<uint16_t> r1 = {bf16_bits(2.5f), bf16_bits(0.15625f)};
  const std::vector<uint16_t> r2 = {bf16_bits(-0.33203125f), bf16_bits(5.0f)};
  const std::vector<uint16_t> shared = {bf16_bits(0.125f), bf16_bits(-1.0f)};
  const std::vector<uint16_t> y =
      combine_token_row(slots, gates, {r0.data(), r1.data(), r2.data()}, shared.data(), 2, 0, false);
  for (int d = 0; d < 2; ++d) {
    SCOPED_TRACE(d);
    const auto v = [](const std::vector<uint16_t>& r, int i) { return bf16_to_float(r[static_cast<size_t>(i)]); };
    // Group of rank 0 in slot order (slot 0, then slot 2), led by slot 2; rank 1's led by slot 1.
    const float rank0 = std::fma(gates[2], v(r2, d), std::fma(gates[0], v(r0, d), 0.0f));
    const float rank1 = std::fma(gates[1], v(r1, d), 0.0f);
    // The home adds the leaders in slot order: slot 1 (rank 1) before slot 2 (rank 0).
    float acc = v(shared, d);
    acc = acc + bf16_to_float(bf16_bits(rank1));
    acc = acc + bf16_to_float(bf16_bits(rank0));
    EXPECT_EQ(y[static_cast<size_t>(d)], bf16_bits(acc));
  }
  // Without a shared row the sum starts from zero; per route each product is rounded alone.
  const std::vector<uint16_t> per_route =
      combine_token_row(slots, gates, {r0.data(), r1.data(), r2.data()}, nullptr, 2, 0, true);
  const float want = bf16_to_float(bf16_bits(gates[0] * bf16_to_float(r0[0]))) +
                     bf16_to_float(bf16_bits(gates[1] * bf16_to_float(r1[0]))) +
                     bf16_to_float(bf16_bits(gates[2] * bf16_to_float(r2[0])));
  EXPECT_EQ(per_route[0], bf16_bits(want));
}

TEST(CombineGroups, RejectsANegativeWindow) {
  EXPECT_THROW(combine_group_leaders({{true, 0, 1}}, -1, false), Error);
}

}  // namespace
}  // namespace caracal
