#pragma once
// An A operand gathered row by row: the producer warp copies each k tile of a 128-row tile with
// cp.async (16 bytes a copy) from rows scattered anywhere in global memory into a stage laid out
// exactly as the TMA lays a K-major row tile (128-byte rows, the 16-byte unit u of row r at unit
// u ^ (r % 8): CU_TENSOR_MAP_SWIZZLE_128B), so the consumers' wgmma reads it unchanged. The fused
// forward uses it to read tokens' x rows where they already are instead of copying them into
// expert-contiguous rows first.
//
// Per tile the warp fills a table of the 128 rows' sources (nullptr: a padding row, zero-filled).
// Per k tile, lane 8q + u copies unit u of rows q, q + 4, ..., so each copy instruction moves four
// whole 128-byte row pieces; then every lane hands its copies to the stage's full barrier
// (cp.async.mbarrier.arrive: the barrier's phase cannot complete before they land). The warp's
// leader must arrive on the barrier (and announce its TMA bytes) only after every lane did this.
//
// The copies write shared memory through the generic proxy: a consumer reading the stage with
// wgmma (async proxy) fences after its wait (gathered_stage_fence).
#include <cuda_bf16.h>

#include <cstdint>

#include <cutlass/arch/barrier.h>

#include "device/gemm/gemm_config.cuh"

namespace caracal::gemm {

static_assert(kBlockK * sizeof(Element) == 128, "a gathered k tile is one 128-byte unit row");

struct GatherTable {
  const __nv_bfloat16* rows[kBlockM];  // each row's first element; nullptr: zero-fill
};

// One lane of the producer warp, for every k tile of a tile: copies its units of A's k tile
// `k_index` (elements [k_index, k_index + 64) of each row) into `stage` and arms `full` with them.
// `any_row`: a valid global address, named by the zero-filling copies (which read nothing).
__device__ inline void gather_k_tile(const GatherTable& table, const __nv_bfloat16* any_row, int k_index,
                                     Element* stage, uint64_t* full, int lane) {
  const int unit = lane % 8;
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(stage));
#pragma unroll 4
  for (int row = lane / 8; row < kBlockM; row += 4) {
    const __nv_bfloat16* src = table.rows[row];
    const uint32_t bytes = src != nullptr ? 16u : 0u;  // 0: fill zeros
    const void* from = src != nullptr ? src + k_index + unit * 8 : any_row;
    const uint32_t to = base + static_cast<uint32_t>(row * 128 + ((unit ^ (row % 8)) << 4));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(to), "l"(from), "r"(bytes) : "memory");
  }
  asm volatile("cp.async.mbarrier.arrive.shared::cta.b64 [%0];" ::"r"(
                   static_cast<uint32_t>(__cvta_generic_to_shared(full)))
               : "memory");
}

// A consumer, after waiting for a stage with gathered operands and before its wgmmas read it.
__device__ inline void gathered_stage_fence() { cutlass::arch::fence_view_async_shared(); }

}  // namespace caracal::gemm
