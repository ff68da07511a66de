#pragma once
// One read of a token per (token, rank), not per route (DESIGN §2): a token with several routes to
// this rank's experts is loaded once from its home rank, and the warp stores the row into each of
// those routes' rows. The token's routes whose rows lie in the pull's window (a ring's macrobatch,
// or the rows a pull fills at once) form its group; the group's lowest row leads it: the warp that
// meets the leader pulls for the whole group, the warps that meet the others skip them. The rows
// each get the same bits as a pull per route, so nothing downstream changes; only the home rows are
// read fewer times (NVLink bytes between GPUs, HBM reads on one).
//
// The schedule builder leaves each route's row on this rank in route_rows (schedule_build.cuh),
// [source][token * k + slot]; a group is read from the token's k entries there, lane j holding
// slot j (slots j + 32, ... in further rounds when k > 32).
#include <climits>
#include <cstdint>

#include "device/transfer/row_copy.cuh"

namespace caracal::transfer {

class TokenGroup {
 public:
  // The group of schedule row `row` (a real row, `entry` = {src_rank, src_route}) in the window
  // [begin, end). `route_rows`: this rank's table ([W][routes]); nullptr pulls per route: the
  // group is the row alone.
  __device__ TokenGroup(const int32_t* route_rows, int routes, int top_k, int2 entry, int row, int begin, int end)
      : slot_rows_(route_rows != nullptr
                       ? route_rows + static_cast<int64_t>(entry.x) * routes + (entry.y - entry.y % top_k)
                       : nullptr),
        top_k_(top_k),
        first_route_(entry.y - entry.y % top_k),
        own_slot_(entry.y % top_k),
        own_row_(row),
        begin_(begin),
        end_(end) {}

  // Slot `slot`'s row if that route is in the group, else -1.
  __device__ int member(int slot) const {
    if (slot >= top_k_) return -1;
    if (slot_rows_ == nullptr) return slot == own_slot_ ? own_row_ : -1;
    const int row = slot_rows_[slot];
    return row >= begin_ && row < end_ ? row : -1;
  }

  // Whether this row leads its group (warp-uniform: all lanes call).
  __device__ bool led_by_own_row(int lane) const {
    int lowest = INT_MAX;
    for (int base = 0; base < top_k_; base += kWarpSize) {
      const int row = member(base + lane);
      if (row >= 0) lowest = min(lowest, row);
    }
    return __reduce_min_sync(~0u, lowest) == own_row_;
  }

  // Whether this row is the group's highest (warp-uniform: all lanes call): the backward's dx
  // groups are led by it, so that a group can be summed as soon as its leader's block is done.
  __device__ bool last_is_own_row(int lane) const {
    int highest = -1;
    for (int base = 0; base < top_k_; base += kWarpSize) highest = max(highest, member(base + lane));
    return __reduce_max_sync(~0u, highest) == own_row_;
  }

  // The home route of slot `slot`.
  __device__ int route(int slot) const { return first_route_ + slot; }
  __device__ int top_k() const { return top_k_; }

 private:
  const int32_t* slot_rows_;  // the token's k entries of route_rows, or nullptr (per route)
  int top_k_;
  int first_route_;  // token * k
  int own_slot_;
  int own_row_;
  int begin_, end_;
};

// Calls visit(slot, row) from every lane, round by round (slot = round * 32 + lane, while slots
// remain), `row` being the slot's row if it is a member, else -1: warp-uniform, so visit may use
// warp-wide operations.
template <typename Visit>
__device__ void for_each_slot_round(const TokenGroup& group, int lane, Visit&& visit) {
  for (int base = 0; base < group.top_k(); base += kWarpSize) visit(base + lane, group.member(base + lane));
}

// Calls visit(slot, row) for every member of `group`, each from its slot's lane; several lanes
// visit at once. Call from all lanes.
template <typename Visit>
__device__ void for_each_member(const TokenGroup& group, int lane, Visit&& visit) {
  for_each_slot_round(group, lane, [&](int slot, int row) {
    if (row >= 0) visit(slot, row);
  });
}

// Every member's g from its route's home gate: home_gates [T*k] of the group's home rank into
// expert_gates [rows] of the pulling one. Call from all lanes.
__device__ __forceinline__ void pull_group_gates(const TokenGroup& group, const float* home_gates, float* expert_gates,
                                                 int lane) {
  for_each_member(group, lane, [&](int slot, int member) { expert_gates[member] = home_gates[group.route(slot)]; });
}

// One warp loads `vectors` 16-byte vectors from src once and stores them into every member's row
// (row_of(row): its first vector). kCoherent as warp_copy_row. Call from all lanes.
template <bool kCoherent, typename RowOf>
__device__ void warp_fan_out_row(const TokenGroup& group, const uint4* src, int vectors, RowOf&& row_of, int lane) {
  for_each_slot_round(group, lane, [&](int, int mine) {
    const unsigned members = __ballot_sync(~0u, mine >= 0);
    if (members != 0u) warp_fan_out_vectors<kCoherent>(src, 0, vectors, members, mine, row_of, lane);
  });
}

}  // namespace caracal::transfer
