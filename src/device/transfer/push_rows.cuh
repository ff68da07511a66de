#pragma once
// The expert side of the pushes (combine, reverse dispatch), one warp per schedule row (DESIGN §2):
// the row is stored into its home rank's slot `src_route` ([T*k][D] in the home heap); every
// (token, slot) has exactly one writer. `entry` is the row's schedule entry {src_rank, src_route};
// src_rank < 0 marks padding. The pulls read a token once for all its rows: token_group.cuh.
#include <cuda_bf16.h>

#include <cstdint>

#include "caracal/comm/symmetric_ptr.hpp"
#include "device/comm/device_world.cuh"
#include "device/transfer/row_copy.cuh"

namespace caracal::transfer {

// Stores `src` (this rank's row, unchanged during the launch) into the home rank's slot; padding
// rows push nothing. Visible at the home rank after the next world barrier.
__device__ inline void push_slot_row(const comm::DeviceWorld& world, int2 entry, const uint4* src,
                                     comm::SymmetricPtr<__nv_bfloat16> home_slots, int hidden, int lane) {
  if (entry.x < 0) return;
  warp_copy_row(row_vectors(world.at(home_slots, entry.x), entry.y, hidden), src, hidden / kBf16PerVector, lane);
}

}  // namespace caracal::transfer
