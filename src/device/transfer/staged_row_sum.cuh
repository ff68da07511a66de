#pragma once
// One warp sums a few bf16 rows into one (combine's group sums and home sums, group_sum.cuh) with
// its loads staged through shared memory by cp.async: a load in flight then holds no register, so
// a warp keeps kStagedLoads - 1 of them outstanding where registers allowed four, each warp
// waiting on its own chain of loads.
//
// The work is a sequence of items (vector chunk c, row m), chunks of 32 vectors in order and, in
// each, the rows in order; a lane loads vector 32 c + lane of row m into its own 16 bytes of the
// item's stage slot and later reads back only those, so no lane reads what another wrote and the
// warp needs no barrier: cp.async.wait_group orders each lane's own copies. The sum of a chunk
// starts at 0 and calls accumulate(acc, m, value) for m = 0, 1, ... in order: the caller's
// float operations, in its order, so the bits are those of the register version.
#include <cstdint>

#include "device/transfer/row_copy.cuh"

namespace caracal::transfer {

// Stage slots per warp: each holds one 16-byte vector per lane (512 bytes a slot, 8 KiB a warp).
inline constexpr int kStagedLoads = 16;
inline constexpr int kStagedBytesPerWarp = kStagedLoads * kWarpSize * 16;
// The most rows one staged sum takes (one per lane).
inline constexpr int kMaxStagedRows = kWarpSize;

// Dynamic shared memory of a CTA of `threads` threads whose warps each stage their sums.
constexpr size_t staged_sum_shared_bytes(int threads) { return size_t(threads / kWarpSize) * kStagedBytesPerWarp; }

// This warp's stage in such a CTA's dynamic shared memory `cta_stages`.
__device__ __forceinline__ uint4* warp_stage(uint4* cta_stages) {
  return cta_stages + threadIdx.x / kWarpSize * (kStagedBytesPerWarp / sizeof(uint4));
}

// The position of the (n + 1)-th set bit of `mask` (0 for none): the n-th member of a ballot.
__device__ __forceinline__ int nth_set_bit(unsigned mask, int n) {
  for (int i = 0; i < n && mask != 0u; ++i) mask &= mask - 1u;
  return mask != 0u ? __ffs(mask) - 1 : 0;
}

__device__ __forceinline__ void cp_async16(uint4* smem_dst, const uint4* global_src) {
  const uint32_t to = static_cast<uint32_t>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(to), "l"(global_src) : "memory");
}

// Sums `count` (warp-uniform, <= kMaxStagedRows) rows of `vectors` 16-byte vectors into `dst`:
// lane j < count holds row j's first vector in `my_row`. The copies read through L2 and allocate
// no L1 line (.cg), so rows that other CTAs or ranks stored earlier in the launch, ordered by a
// barrier, are read as ld.global would read them. `stage`: this warp's kStagedBytesPerWarp bytes
// of shared memory. No rows: dst is zeroed. Call from all lanes.
template <typename Accumulate>
__device__ void warp_staged_row_sum(int count, const uint4* my_row, int vectors, uint4* dst, uint4* stage, int lane,
                                    Accumulate&& accumulate) {
  if (count == 0) {
    warp_zero_row(dst, vectors, lane);
    return;
  }
  const int chunks = (vectors + kWarpSize - 1) / kWarpSize;
  const int items = chunks * count;
  int issue_chunk = 0, issue_row = 0;  // the next item to load
  const auto issue_next = [&](int item) {
    if (item < items) {
      const uint4* row = reinterpret_cast<const uint4*>(
          __shfl_sync(~0u, reinterpret_cast<uintptr_t>(my_row), issue_row));
      const int v = issue_chunk * kWarpSize + lane;
      if (v < vectors) cp_async16(stage + (item % kStagedLoads) * kWarpSize + lane, row + v);
      if (++issue_row == count) {
        issue_row = 0;
        ++issue_chunk;
      }
    }
    asm volatile("cp.async.commit_group;" ::: "memory");  // empty past the end: the count stays uniform
  };
  for (int item = 0; item < kStagedLoads - 1; ++item) issue_next(item);
  float acc[kBf16PerVector];
  int row = 0, chunk = 0;
  for (int item = 0; item < items; ++item) {
    issue_next(item + kStagedLoads - 1);
    asm volatile("cp.async.wait_group %0;" ::"n"(kStagedLoads - 1) : "memory");  // item `item` landed
    const int v = chunk * kWarpSize + lane;
    if (row == 0) {
#pragma unroll
      for (int i = 0; i < kBf16PerVector; ++i) acc[i] = 0.0f;
    }
    float value[kBf16PerVector];
    unpack_bf16x8(v < vectors ? stage[(item % kStagedLoads) * kWarpSize + lane] : make_uint4(0u, 0u, 0u, 0u), value);
    accumulate(acc, row, value);
    if (++row == count) {
      if (v < vectors) store16(dst + v, pack_bf16x8(acc));
      row = 0;
      ++chunk;
    }
  }
  asm volatile("cp.async.wait_group 0;" ::: "memory");  // no copy outlives the call (none is left)
}

}  // namespace caracal::transfer
