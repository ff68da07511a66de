#pragma once
// The expert side of the four transfers, one warp per schedule row (DESIGN §2):
//   pull (dispatch, reverse combine): the row is loaded from its home rank's token row
//         `src_route / k` ([T][D] in the home heap) into this rank's expert-contiguous buffer;
//   push (combine, reverse dispatch): the row is stored into its home rank's slot `src_route`
//         ([T*k][D] in the home heap); every (token, slot) has exactly one writer.
// `entry` is the row's schedule entry {src_rank, src_route}; src_rank < 0 marks padding.
#include <cuda_bf16.h>

#include <cstdint>

#include "caracal/comm/symmetric_ptr.hpp"
#include "device/comm/device_world.cuh"
#include "device/transfer/row_copy.cuh"

namespace caracal::transfer {

// Fills `dst` (this rank's row) from the home token row, or zeroes it for a padding row. The home
// rows must not change during the launch (they are published before its entry barrier; see
// row_copy.cuh). kCoherent: ld.global (the layer's default, measured faster), else ld.global.nc.
template <bool kCoherent>
__device__ inline void pull_token_row(const comm::DeviceWorld& world, int2 entry,
                                      comm::SymmetricPtr<__nv_bfloat16> home_tokens, int top_k, int hidden, uint4* dst,
                                      int lane) {
  const int vectors = hidden / kBf16PerVector;
  if (entry.x < 0) {
    warp_zero_row(dst, vectors, lane);
    return;
  }
  const __nv_bfloat16* tokens = world.at(home_tokens, entry.x);
  warp_copy_row<kCoherent>(dst, row_vectors(tokens, entry.y / top_k, hidden), vectors, lane);
}

// Stores `src` (this rank's row, unchanged during the launch) into the home rank's slot; padding
// rows push nothing. Visible at the home rank after the next world barrier.
__device__ inline void push_slot_row(const comm::DeviceWorld& world, int2 entry, const uint4* src,
                                     comm::SymmetricPtr<__nv_bfloat16> home_slots, int hidden, int lane) {
  if (entry.x < 0) return;
  warp_copy_row(row_vectors(world.at(home_slots, entry.x), entry.y, hidden), src, hidden / kBf16PerVector, lane);
}

}  // namespace caracal::transfer
