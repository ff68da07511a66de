#pragma once
// An A operand gathered row by row: the producer warpgroup copies each k tile of a 128-row tile with
// cp.async (16 bytes a copy) from rows scattered anywhere in global memory into a stage laid out
// exactly as the TMA lays a K-major row tile (128-byte rows, the 16-byte unit u of row r at unit
// u ^ (r % 8): CU_TENSOR_MAP_SWIZZLE_128B), so the consumers' wgmma reads it unchanged. The fused
// forward uses it to read tokens' x rows where they already are instead of copying them into
// expert-contiguous rows first.
//
// Per tile each thread learns the sources of its eight rows (GatherRows; nullptr: a padding row,
// zero-filled). Per k tile, thread 8q + u copies unit u of rows q, q + 16, ..., q + 112 (eight
// copies), so each warp's copy instruction moves four whole 128-byte row pieces; then every
// thread arrives on the stage's full barrier once its copies have landed
// (cp.async.mbarrier.arrive.noinc, as CUTLASS's cp.async pipelines do): the barrier counts
// kGatherArrivals of these besides its other arrivals (its init count includes them). One warp
// alone could not issue the copies as fast as the tensor cores consume them.
//
// The copies write shared memory through the generic proxy: a consumer reading the stage with
// wgmma (async proxy) fences after its wait (gathered_stage_fence).
#include <cuda_bf16.h>

#include <cstdint>

#include <cutlass/arch/barrier.h>

#include "device/gemm/gemm_config.cuh"

namespace caracal::gemm {

// The gathering threads (the producer warpgroup), each arriving once per k tile on its stage's full
// barrier, and the named barrier they meet at (a CUTLASS user barrier id: the epilogues' chunk
// stores use 0 and 1).
inline constexpr int kGatherThreads = 128;
inline constexpr uint32_t kGatherArrivals = kGatherThreads;
inline constexpr uint32_t kGatherBarrier = 2;

// All gathering threads meet (and what each wrote to shared memory before is visible to all after).
__device__ inline void gather_threads_sync() {
  cutlass::arch::NamedBarrier::sync(kGatherThreads, kGatherBarrier);
}

// All gathering threads meet; returns how many of them passed `predicate` true.
__device__ inline int gather_threads_count(bool predicate) {
  int count;
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.u32 p, %1, 0;\n barrier.cta.red.popc.u32 %0, %2, %3, p;\n}"
      : "=r"(count)
      : "r"(static_cast<uint32_t>(predicate)),
        "r"(kGatherBarrier + cutlass::arch::NamedBarrier::ReservedNamedBarrierCount), "r"(kGatherThreads)
      : "memory");
  return count;
}

// All gathering threads meet; true if every one passed `predicate` true.
__device__ inline bool gather_threads_all(bool predicate) {
  uint32_t all;
  asm volatile(
      "{\n .reg .pred p, q;\n setp.ne.u32 p, %1, 0;\n barrier.cta.red.and.pred q, %2, %3, p;\n"
      " selp.u32 %0, 1, 0, q;\n}"
      : "=r"(all)
      : "r"(static_cast<uint32_t>(predicate)),
        "r"(kGatherBarrier + cutlass::arch::NamedBarrier::ReservedNamedBarrierCount), "r"(kGatherThreads)
      : "memory");
  return all != 0;
}

// The rows one gathering thread copies: row thread / 8 + 16 j of the tile is src[j] (its first
// element; nullptr: zero-fill).
inline constexpr int kGatherRowsPerThread = kBlockM * 8 / kGatherThreads;
struct GatherRows {
  const __nv_bfloat16* src[kGatherRowsPerThread];
};
__device__ inline int gather_row(int thread, int j) { return thread / 8 + j * (kGatherThreads / 8); }

// One gathering thread (`thread` in [0, kGatherThreads)), for every k tile of a tile: copies its
// units of A's k tile `k_index` (elements [k_index, k_index + Tile::kBlockK) of each row: one
// 128-byte unit row) into `stage`, a stage of the A operand tile `Tile` (a policy's, of bf16
// rows), and arms `full` with them. `any_row`: a valid global address, named by the zero-filling
// copies (which read nothing).
template <class Tile>
__device__ void gather_k_tile(const GatherRows& rows, const __nv_bfloat16* any_row, int k_index,
                              typename Tile::Element* stage, uint64_t* full, int thread) {
  static_assert(sizeof(typename Tile::Element) == sizeof(__nv_bfloat16) && Tile::kRows == kBlockM,
                "a gathered stage holds a row block of bf16 rows");
  const int unit = thread % 8;
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(stage));
#pragma unroll
  for (int j = 0; j < kGatherRowsPerThread; ++j) {
    const int row = gather_row(thread, j);
    const __nv_bfloat16* src = rows.src[j];
    const uint32_t bytes = src != nullptr ? 16u : 0u;  // 0: fill zeros
    const void* from = src != nullptr ? src + k_index + unit * 8 : any_row;
    const uint32_t to = base + static_cast<uint32_t>(row * 128 + ((unit ^ (row % 8)) << 4));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(to), "l"(from), "r"(bytes) : "memory");
  }
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(
                   static_cast<uint32_t>(__cvta_generic_to_shared(full)))
               : "memory");
}

// A consumer, after waiting for a stage with gathered operands and before its wgmmas read it.
__device__ inline void gathered_stage_fence() { cutlass::arch::fence_view_async_shared(); }

}  // namespace caracal::gemm
