#pragma once
// Combine per (token, rank) (DESIGN §2): one row goes home per token group, not one per route.
// A group is a token's routes processed on one rank whose rows lie in one window of `group_rows`
// schedule rows (the fused forward's macrobatch; 0: the whole schedule, one group per (token,
// rank)); its leader is the member with the lowest row (token_group.cuh), as for the pulls.
//   expert side: sum_j g_j * out_j over the group in slot order, in fp32 (__fmaf_rn from 0),
//                rounded once to bf16, stored into the home slot of the leader's route;
//   home side:   y = shared + the leader slots in slot order (slot_reduce.cuh), rounded once.
// Per route (ExchangeOptions::rows_per_route) every route is a group of its own. A host twin
// performing the same float operations in the same order (std::fma for __fmaf_rn) gets the same
// bits.
#include <cstdint>

#include "device/transfer/router_math.cuh"
#include "device/transfer/row_copy.cuh"
#include "device/transfer/routing_fault.cuh"
#include "device/transfer/slot_reduce.cuh"
#include "device/transfer/staged_row_sum.cuh"
#include "device/transfer/token_group.cuh"

namespace caracal::transfer {

// A token's gates as the expert side computes them from its home's router inputs (the gates
// buffer may not be written yet when the fused forward runs): g_slot = factor * scores[slot].
struct GroupGates {
  float factor;          // warp_gate_factor
  const float* scores;   // the token's k topk_scores on its home rank

  __device__ float of(int slot) const { return __fmul_rn(factor, scores[slot]); }
};

// The backward's dx groups: members summed unweighted (fma(1, v, acc) is acc + v, rounded once).
struct UnitGates {
  __device__ float of(int) const { return 1.0f; }
};

// One warp: the weighted sum of `group`'s output rows (row_of(row): a member's first vector; gates:
// GroupGates, or UnitGates for a plain sum), stored into `dst` (the leader route's home slot). kCoherent: the rows were stored during this
// launch (ld.global), else before it (ld.global.nc). kInFlight: member rows loaded before they are
// accumulated (as many registers as the caller can spare). Call from all lanes, for a group this
// row leads.
template <bool kCoherent, int kInFlight, typename Gates, typename RowOf>
__device__ void warp_store_group_sum(const TokenGroup& group, const Gates& gates, RowOf&& row_of, uint4* dst,
                                     int vectors, int lane) {
  // The first 32 slots' members and gates stay in registers; further rounds (k > 32) are looked
  // up again for every vector.
  const int first_row = group.member(lane);
  const float first_gate = first_row >= 0 ? gates.of(lane) : 0.0f;
  for (int first = 0; first < vectors; first += kWarpSize) {  // warp-uniform trip count
    const int v = first + lane;
    const bool in_row = v < vectors;
    float acc[kBf16PerVector];
#pragma unroll
    for (int i = 0; i < kBf16PerVector; ++i) acc[i] = 0.0f;
    for (int base = 0; base < group.top_k(); base += kWarpSize) {
      const int mine = base == 0 ? first_row : group.member(base + lane);
      const float my_gate = base == 0 ? first_gate : (mine >= 0 ? gates.of(base + lane) : 0.0f);
      unsigned rest = __ballot_sync(~0u, mine >= 0);
      while (rest != 0u) {
        bool used[kInFlight];
        float gate[kInFlight];
        uint4 row[kInFlight];
#pragma unroll
        for (int u = 0; u < kInFlight; ++u) {  // the next members in slot order
          used[u] = rest != 0u;
          const int src_lane = used[u] ? __ffs(rest) - 1 : 0;
          if (used[u]) rest &= rest - 1u;
          const int member_row = __shfl_sync(~0u, mine, src_lane);
          gate[u] = __shfl_sync(~0u, my_gate, src_lane);
          row[u] = used[u] && in_row ? load_row16<kCoherent>(row_of(member_row) + v) : make_uint4(0u, 0u, 0u, 0u);
        }
#pragma unroll
        for (int u = 0; u < kInFlight; ++u) {
          if (!used[u]) continue;
          float value[kBf16PerVector];
          unpack_bf16x8(row[u], value);
#pragma unroll
          for (int i = 0; i < kBf16PerVector; ++i) acc[i] = __fmaf_rn(gate[u], value[i], acc[i]);
        }
      }
    }
    if (in_row) store16(dst + v, pack_bf16x8(acc));
  }
}

// warp_store_group_sum with the member rows staged through shared memory (staged_row_sum.cuh:
// more loads in flight per warp), for top_k <= kMaxStagedRows (a slot per lane); the same float
// operations in the same order, so the same bits. The rows must have been stored before the
// launch or before a barrier that orders them. `stage`: the warp's kStagedBytesPerWarp bytes.
template <typename RowOf>
__device__ void warp_store_group_sum_staged(const TokenGroup& group, const GroupGates& gates, RowOf&& row_of,
                                            uint4* dst, int vectors, uint4* stage, int lane) {
  const unsigned members = __ballot_sync(~0u, group.member(lane) >= 0);
  const int count = __popc(members);
  const int slot = nth_set_bit(members, lane);  // lane j: the group's j-th member in slot order
  const bool mine = lane < count;
  const float gate = mine ? gates.of(slot) : 0.0f;
  warp_staged_row_sum(count, mine ? row_of(group.member(slot)) : nullptr, vectors, dst, stage, lane,
                      [&](float (&acc)[kBf16PerVector], int m, const float (&value)[kBf16PerVector]) {
                        const float g = __shfl_sync(~0u, gate, m);
#pragma unroll
                        for (int i = 0; i < kBf16PerVector; ++i) acc[i] = __fmaf_rn(g, value[i], acc[i]);
                      });
}

// How a home rank's slots were filled: which routes form groups and which member leads each.
struct SlotGroups {
  int group_rows = 0;          // a group's rows lie in one window of this many rows (0: the schedule)
  bool per_route = false;      // every route a group of its own
  bool last_row_leads = false;  // the group's highest row leads it (the backward's dx), else its lowest
  int per_route_rank = -1;     // the routes to this rank are groups of their own (-1: none)
};

// The home side's view of a token's groups: which of its k slots hold a group's sum (the leader
// slots), from route_location ({rank, row} of each route, written by build_schedule). Made by the
// warp that sums the token; the first 32 slots' answers are kept as a bit mask.
class LeaderSlots {
 public:
  __device__ LeaderSlots(const int2* locations, const int32_t* ids, int num_experts, int top_k, const SlotGroups& groups,
                         int lane)
      : locations_(locations),
        ids_(ids),
        num_experts_(num_experts),
        top_k_(top_k),
        groups_(groups),
        first_mask_(__ballot_sync(~0u, lane < top_k && leads(lane))) {}

  __device__ bool operator()(int slot) const {
    return slot < kWarpSize ? ((first_mask_ >> slot) & 1u) != 0u : leads(slot);
  }

 private:
  // Whether `slot` is routed and no other route of its token to the same rank and window comes
  // before it in the leading order (a lower row; with last_row_leads a higher one).
  __device__ bool leads(int slot) const {
    if (!is_routed(ids_[slot], num_experts_)) return false;
    if (groups_.per_route) return true;
    const int2 own = locations_[slot];
    if (own.x == groups_.per_route_rank) return true;
    for (int j = 0; j < top_k_; ++j) {
      if (j == slot || !is_routed(ids_[j], num_experts_)) continue;
      const int2 other = locations_[j];
      const bool same_window = groups_.group_rows == 0 || other.y / groups_.group_rows == own.y / groups_.group_rows;
      const bool before = groups_.last_row_leads ? other.y > own.y : other.y < own.y;
      if (other.x == own.x && same_window && before) return false;
    }
    return true;
  }

  const int2* locations_;
  const int32_t* ids_;
  int num_experts_;
  int top_k_;
  SlotGroups groups_;
  unsigned first_mask_;
};

}  // namespace caracal::transfer
