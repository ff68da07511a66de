#pragma once
// Combine in one pass when the world has one rank: a token's routes and its home are on the same
// GPU, so one warp can do for a token what combine's expert side and home side do in two passes
// (group_sum.cuh, slot_reduce.cuh) with the same float operations in the same order, so the same
// bits, without storing group sums into slots and without a barrier between the passes:
//   y = shared + sum over the token's groups (leaders in slot order) of bf16(sum_j g_j * out_j)
// A group whose rows this launch reads (its leader's schedule row below CombinePush::end_row) is
// summed from them; a group that the fused forward summed earlier (a later macrobatch's, rows
// since overwritten in the ring) is read from its leader's slot, as the home side would.
//
// The rows are accumulated by warp_staged_row_sum (staged_row_sum.cuh), one row per lane, in the
// order the sums take them: the shared row, then for each leader slot either its group's member
// rows in slot order or its slot row. Lane m's TokenSumRow says what row m is.
#include <climits>
#include <cstdint>

#include "device/transfer/router_math.cuh"
#include "device/transfer/row_copy.cuh"
#include "device/transfer/routing_fault.cuh"
#include "device/transfer/staged_row_sum.cuh"

namespace caracal::transfer {

// What one token's sum reads, for its home rank in a world of one rank.
struct TokenSumInputs {
  const int32_t* ids;      // the token's k expert ids (topk_idx)
  const float* scores;     // its k router scores
  const int2* locations;   // its k routes' {rank, schedule row} (route_location)
  const uint4* rows;       // the expert output rows (CombinePush::rows), schedule row r at r
  const uint4* slots;      // its k slot rows (combine_slots)
  const uint4* shared;     // its shared-expert row, or null
  int num_experts;
  int top_k;               // < kMaxStagedRows: the shared row and every route fit a lane each
  int group_rows;          // CombinePush::group_rows (0: one window)
  int end_row;             // rows below it are read here; INT_MAX: all
  bool per_route;          // ExchangeOptions::rows_per_route: every route a group of its own
  int vectors;             // 16-byte vectors per row
  RouterScaling scaling;
};

// Lane m's row of a token's sum (m < count), and how it enters the sum.
struct TokenSumRow {
  enum Kind : int { kShared = 0, kSlot = 1, kMember = 2 };
  const uint4* row = nullptr;
  float gate = 0.0f;   // kMember: g of the member's slot
  int kind = kShared;
  bool opens_group = false;   // kMember: the group's lowest slot (its sum starts at 0)
  bool closes_group = false;  // kMember: the group's highest slot (its sum is rounded and added)
};

// The rows of one token's sum, a lane each, in order; returns their count (warp-uniform). Call
// from all lanes.
__device__ inline int token_sum_rows(const TokenSumInputs& in, int lane, TokenSumRow& mine) {
  const bool routed = lane < in.top_k && is_routed(in.ids[lane], in.num_experts);
  const int row = routed ? in.locations[lane].y : INT_MAX;
  const int window = in.group_rows > 0 && routed ? row / in.group_rows : 0;
  const unsigned routed_lanes = __ballot_sync(~0u, routed);
  // The slot's group leader: the lowest row among the routed slots in its window (as TokenGroup
  // and LeaderSlots pick it); first and last slots of the group.
  int leader = lane, leader_row = row, group_first = lane, group_last = lane;
  for (int i = 0; i < in.top_k; ++i) {
    const int row_i = __shfl_sync(~0u, row, i);
    const int window_i = __shfl_sync(~0u, window, i);
    const bool same_group = !in.per_route && ((routed_lanes >> i) & 1u) != 0u && window_i == window;
    if (same_group && row_i < leader_row) {
      leader = i;
      leader_row = row_i;
    }
    if (same_group) {
      group_first = min(group_first, i);
      group_last = max(group_last, i);
    }
  }
  const bool from_rows = leader_row < in.end_row;
  const bool contributes = routed && (from_rows || leader == lane);
  const unsigned contributing = __ballot_sync(~0u, contributes);
  // Position in the sum: by leader slot, then by slot.
  const int key = leader * kWarpSize + lane;
  const int first = in.shared != nullptr ? 1 : 0;
  int position = first;
  for (int i = 0; i < in.top_k; ++i) {
    const int key_i = __shfl_sync(~0u, key, i);
    if (((contributing >> i) & 1u) != 0u && key_i < key) ++position;
  }
  TokenSumRow own;
  if (contributes) {
    own.row = from_rows ? in.rows + static_cast<int64_t>(row) * in.vectors
                        : in.slots + static_cast<int64_t>(lane) * in.vectors;
    own.kind = from_rows ? TokenSumRow::kMember : TokenSumRow::kSlot;
    own.opens_group = group_first == lane;
    own.closes_group = group_last == lane;
  }
  const float factor = warp_gate_factor(in.ids, in.scores, in.num_experts, in.top_k, in.scaling, lane);
  if (contributes && from_rows) own.gate = __fmul_rn(factor, in.scores[lane]);
  // Each row to the lane of its position (lane 0: the shared row, if any).
  mine = TokenSumRow{};
  if (lane < first) mine.row = in.shared;
  for (int i = 0; i < in.top_k; ++i) {
    const int position_i = __shfl_sync(~0u, position, i);
    const uintptr_t row_i = __shfl_sync(~0u, reinterpret_cast<uintptr_t>(own.row), i);
    const float gate_i = __shfl_sync(~0u, own.gate, i);
    const int flags_i = __shfl_sync(~0u, own.kind | (own.opens_group ? 4 : 0) | (own.closes_group ? 8 : 0), i);
    if (((contributing >> i) & 1u) != 0u && position_i == lane) {
      mine.row = reinterpret_cast<const uint4*>(row_i);
      mine.gate = gate_i;
      mine.kind = flags_i & 3;
      mine.opens_group = (flags_i & 4) != 0;
      mine.closes_group = (flags_i & 8) != 0;
    }
  }
  return first + __popc(contributing);
}

// One warp: vectors [first_vector, first_vector + vectors) of one token's y, from `in`, into `y`
// (the token's output row). `stage`: the warp's kStagedBytesPerWarp bytes. Call from all lanes.
__device__ inline void warp_single_rank_combine(const TokenSumInputs& in, int first_vector, int vectors, uint4* y,
                                                uint4* stage, int lane) {
  TokenSumRow mine;
  const int count = token_sum_rows(in, lane, mine);
  const int flags = mine.kind | (mine.opens_group ? 4 : 0) | (mine.closes_group ? 8 : 0);
  float group[kBf16PerVector];  // the current group's sum (group_sum.cuh's acc)
  warp_staged_row_sum(count, mine.row != nullptr ? mine.row + first_vector : nullptr, vectors, y + first_vector,
                      stage, lane, [&](float (&acc)[kBf16PerVector], int m, const float (&value)[kBf16PerVector]) {
                        const int flags_m = __shfl_sync(~0u, flags, m);
                        const float gate_m = __shfl_sync(~0u, mine.gate, m);
                        const int kind = flags_m & 3;
                        if (kind == TokenSumRow::kShared) {  // the home sum's start (slot_reduce.cuh)
#pragma unroll
                          for (int i = 0; i < kBf16PerVector; ++i) acc[i] = value[i];
                        } else if (kind == TokenSumRow::kSlot) {
#pragma unroll
                          for (int i = 0; i < kBf16PerVector; ++i) acc[i] = __fadd_rn(acc[i], value[i]);
                        } else {
                          if ((flags_m & 4) != 0) {
#pragma unroll
                            for (int i = 0; i < kBf16PerVector; ++i) group[i] = 0.0f;
                          }
#pragma unroll
                          for (int i = 0; i < kBf16PerVector; ++i) group[i] = __fmaf_rn(gate_m, value[i], group[i]);
                          if ((flags_m & 8) != 0) {  // the slot's bf16 value, added as the home adds it
                            float rounded[kBf16PerVector];
                            unpack_bf16x8(pack_bf16x8(group), rounded);
#pragma unroll
                            for (int i = 0; i < kBf16PerVector; ++i) acc[i] = __fadd_rn(acc[i], rounded[i]);
                          }
                        }
                      });
}

}  // namespace caracal::transfer
