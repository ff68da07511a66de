#pragma once
// The home side of combine and reverse dispatch: one token's slot rows summed in slot order, one
// warp per token, lanes over 16-byte vectors (DESIGN §2, "Determinism"):
//   combine:          y  = shared + sum_{leader slots s} slot_s   (the slots hold the expert
//                     side's weighted group sums, group_sum.cuh)
//   reverse dispatch: dx = shared + sum_{routed s} slot_s
// in fp32 with every operation spelled out (__fadd_rn: the compiler may not reorder them), rounded
// to bf16 once. A host twin performing the same float operations in the same order gets the same
// bits. Slots that are not summed are never read: nothing was pushed there.
#include <cstdint>

#include "device/transfer/routing_fault.cuh"
#include "device/transfer/row_copy.cuh"
#include "device/transfer/staged_row_sum.cuh"

namespace caracal::transfer {

// Slot rows loaded before they are accumulated: with the usual k <= 8 all of a token's loads are
// in flight together.
inline constexpr int kSlotsInFlight = 8;

// `summed(slot)`: whether slot `slot`'s row is part of the sum (the same on every lane);
// `row_of(slot)`: that row's first vector (pushed during this launch and ordered by a world
// barrier, or stored before it); `shared` the token's shared-expert row or null; `out` its output
// row; `vectors` of each summed (a slice of the rows, the pointers at its first vector).
// `kInFlight` slot rows are loaded at a time (fewer registers, for warps on a tight budget; the same
// float operations in the same order, so the same bits).
template <int kInFlight = kSlotsInFlight, typename Summed, typename RowOf>
__device__ inline void reduce_token_slots(Summed&& summed, int top_k, RowOf&& row_of, const uint4* shared, uint4* out,
                                          int vectors, int lane) {
  for (int v = lane; v < vectors; v += kWarpSize) {
    float acc[kBf16PerVector];
    if (shared != nullptr) {
      unpack_bf16x8(load_immutable16(shared + v), acc);
    } else {
#pragma unroll
      for (int i = 0; i < kBf16PerVector; ++i) acc[i] = 0.0f;
    }
    for (int first = 0; first < top_k; first += kInFlight) {
      bool used[kInFlight];
      uint4 row[kInFlight];
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        const int slot = first + u;
        used[u] = slot < top_k && summed(slot);
        row[u] = used[u] ? load_coherent16(row_of(slot) + v) : make_uint4(0u, 0u, 0u, 0u);
      }
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        if (!used[u]) continue;
        float value[kBf16PerVector];
        unpack_bf16x8(row[u], value);
#pragma unroll
        for (int i = 0; i < kBf16PerVector; ++i) acc[i] = __fadd_rn(acc[i], value[i]);
      }
    }
    store16(out + v, pack_bf16x8(acc));
  }
}

// reduce_token_slots with the rows staged through shared memory (staged_row_sum.cuh: more loads
// in flight per warp), for top_k < kMaxStagedRows (the shared row and a slot per lane); the same
// float operations in the same order, so the same bits. `stage`: the warp's kStagedBytesPerWarp bytes.
template <typename Summed>
__device__ inline void reduce_token_slots_staged(Summed&& summed, int top_k, const uint4* slots, const uint4* shared,
                                                 uint4* out, int vectors, uint4* stage, int lane) {
  const unsigned summed_slots = __ballot_sync(~0u, lane < top_k && summed(lane));
  const int first = shared != nullptr ? 1 : 0;  // row 0: the shared row, the sum's start
  const int count = first + __popc(summed_slots);
  const uint4* row = nullptr;
  if (lane < first) {
    row = shared;
  } else if (lane < count) {
    row = slots + static_cast<int64_t>(nth_set_bit(summed_slots, lane - first)) * vectors;
  }
  warp_staged_row_sum(count, row, vectors, out, stage, lane,
                      [&](float (&acc)[kBf16PerVector], int m, const float (&value)[kBf16PerVector]) {
#pragma unroll
                        for (int i = 0; i < kBf16PerVector; ++i) {
                          acc[i] = m < first ? value[i] : __fadd_rn(acc[i], value[i]);
                        }
                      });
}

}  // namespace caracal::transfer
