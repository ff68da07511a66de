#pragma once
// An epilogue that stores each output row, rounded once to bf16 (the same bits as
// RowsBf16Epilogue), straight into its route's slot on its home rank: reverse dispatch's push of
// dx rows done by the dx GEMM (DESIGN §2), so no row waits in a buffer of the worst-case size and
// the home rank only sums slots. Padding rows are not stored; a slice of padding rows only stores
// nothing. With group_rows (the fused backward's push per (token, rank)), the rows of tokens on
// other ranks go to their ring rows there instead, for src/fused/dx_group_sums.cuh to sum.
#include <cuda_bf16.h>

#include "caracal/comm/symmetric_ptr.hpp"
#include "device/gemm/bf16_epilogue.cuh"
#include "device/gemm/chunk_store.cuh"
#include "device/gemm/gemm_config.cuh"
#include "device/gemm/tile_coord.cuh"

namespace caracal::gemm {

struct HomeSlotsEpilogue {
  struct Params {
    const int2* rows;                          // the rank's schedule rows {src_rank, src_route}
    char* const* heaps;                        // every rank's heap base (comm::World::device_heap_table)
    comm::SymmetricPtr<__nv_bfloat16> slots;   // [T*k][D] on every home rank
    int hidden;                                // D: the slots' row length and the GEMM's N
    int rank;                                  // this rank (global)
    __nv_bfloat16* group_rows;                 // this rank's ring of expert_dx rows, or nullptr
  };

  template <class Accum>
  __device__ static void apply(Params const& p, TileCoord const& tile, Accum const& acc, bool active,
                               ChunkStoreRing& ring, int warpgroup) {
    if (!active) return;
    const int first = warpgroup * kWarpgroupRows;
    const int2* const rows = p.rows + tile.m_begin + first;
    __nv_bfloat16* dst[ChunkStoreRing::kScatterRowsPerThread];  // the rows this thread stores
    for (int j = 0; j < ChunkStoreRing::kScatterRowsPerThread; ++j) {
      const int2 entry = rows[ring.scatter_row(j)];
      if (entry.x < 0) {
        dst[j] = nullptr;
      } else if (p.group_rows != nullptr && entry.x != p.rank) {
        dst[j] = p.group_rows + static_cast<int64_t>(tile.m_buffer + first + ring.scatter_row(j)) * p.hidden;
      } else {
        dst[j] = reinterpret_cast<__nv_bfloat16*>(__ldg(reinterpret_cast<const uintptr_t*>(p.heaps) + entry.x) +
                                                  p.slots.offset) +
                 static_cast<int64_t>(entry.y) * p.hidden;
      }
    }
    CUTE_UNROLL
    for (int c = 0; c < kTileNOf<Accum> / kChunkCols; ++c) {
      const int col = tile.n_begin + c * kChunkCols;
      if (col >= p.hidden) break;
      ChunkWords words;
      pack_accumulator_chunk(acc, c, words);
      ring.acquire();
      ring.write(words);
      ring.scatter(dst, col);
    }
  }
};

}  // namespace caracal::gemm
