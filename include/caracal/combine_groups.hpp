#pragma once
// Combine per (token, rank) on the host (src/device/transfer/group_sum.cuh says what the device
// does): the twin the transfer tests and the transfer benchmark's spot checks compare y with, bit
// for bit. A token's routes on one rank whose rows lie in one window of `group_rows` schedule rows
// (0: the whole schedule) form a group led by its lowest row; the expert side sums g * out over
// the group in slot order (fma from 0) and rounds once to bf16; the home adds the groups' sums to
// the shared row in the order of their leaders' slots and rounds once. Per route, every route is a
// group of its own.
#include <cstdint>
#include <vector>

namespace caracal {

// Where one slot of a token went: {rank, row} of its schedule row, or unrouted.
struct SlotPlace {
  bool routed = false;
  int rank = -1;
  int row = -1;
};

// For each of a token's slots, the slot that leads its group (itself for a leader), or -1 where
// the slot is not routed.
std::vector<int> combine_group_leaders(const std::vector<SlotPlace>& slots, int group_rows, bool per_route);

// One token's y row (bf16 bits, `hidden` values): `gates` and `rows` per slot (rows[s]: the
// expert output row of slot s, bf16 bits; read only where routed), `shared` the shared expert's
// row or null.
std::vector<uint16_t> combine_token_row(const std::vector<SlotPlace>& slots, const std::vector<float>& gates,
                                        const std::vector<const uint16_t*>& rows, const uint16_t* shared, int64_t hidden,
                                        int group_rows, bool per_route);

}  // namespace caracal
