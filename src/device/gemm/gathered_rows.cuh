#pragma once
// An A operand gathered row by row: for each k tile of a 128-row tile, producer thread r loads row
// r with one TMA box of 1 x 64 elements (128 bytes) into the stage at 128 r bytes. The TMA
// swizzles each row by its shared-memory address (the 128-byte swizzle repeats every 1024 bytes,
// and stages are 1024-byte aligned), so the rows land exactly as one 128 x 64 box of contiguous
// rows would (test_gpu_gathered_rows checks it byte for byte) and the consumers' wgmma reads them
// unchanged. The fused forward uses it to read tokens' x rows where they already are instead of
// copying them into expert-contiguous rows first.
//
// The rows come from two row tensors, each a 3-D TMA map of [local rank][rows][hidden] over the
// symmetric heap (loopback ranks' heaps are equally spaced; a world with one rank per process has
// one): the tokens' home x and this rank's pulled rows (expert_x's ring). A padding row names row
// `padding_row` of the home map, past its end: the TMA zero-fills it and still counts its bytes.
//
// Each thread arrives on the stage's full barrier once after issuing its box: the barrier counts
// kGatherArrivals of these besides its other arrivals (its init count includes them), and the
// producer's thread 0 expects the stage's bytes. (Before: cp.async, 16 bytes a copy, from the
// whole warpgroup; its copies went through the generic proxy, which the consumers had to fence.)
#include <cuda_bf16.h>

#include <cstdint>

#include <cute/arch/copy_sm90_tma.hpp>
#include <cutlass/arch/barrier.h>

#include "device/gemm/gemm_config.cuh"
#include "device/gemm/operand_loads.cuh"

namespace caracal::gemm {

static_assert(kBlockK * sizeof(Element) == 128, "a gathered k tile is one 128-byte row a row");

// The gathering threads (the producer warpgroup, a thread per row), each arriving once per k tile on
// its stage's full barrier, and the named barrier they meet at (a CUTLASS user barrier id: the epilogues' chunk
// stores use 0 and 1).
inline constexpr int kGatherThreads = kBlockM;
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

// The two row tensors a gathered tile reads (kernel parameters: the TMA reads the maps there).
struct GatherMaps {
  CUtensorMap home_rows;    // [local ranks][T][hidden]: the tokens' x
  CUtensorMap pulled_rows;  // [local ranks][ring rows][hidden]: each rank's pulled rows
  int padding_row;          // a row past home_rows' end
};

// Where one row of a tile comes from: row `row` of local rank `rank`'s home or pulled rows.
struct GatherRow {
  bool pulled = false;
  int row = 0;
  int rank = 0;
};

// Producer thread `thread` (row `thread` of the tile): loads elements [k_index, k_index + 64) of
// its row into `stage` and arrives on `full` (whose expected bytes thread 0 posts).
__device__ inline void gather_k_tile(const GatherMaps& maps, const GatherRow& row, int k_index, Element* stage,
                                     uint64_t* full, int thread) {
  const CUtensorMap* map = row.pulled ? &maps.pulled_rows : &maps.home_rows;
  cute::SM90_TMA_LOAD_3D::copy(map, full, kLoadCacheHint, stage + thread * kBlockK, k_index, row.row, row.rank);
  cutlass::arch::ClusterBarrier::arrive(full);
}

}  // namespace caracal::gemm
