#pragma once
// The plain epilogue: a warpgroup's 64 x N fp32 accumulator slice rounded once to bf16 and
// stored (the down projection's y rows, the backward's dx rows; the SwiGLU kernel's gate_up).
#include <cute/tensor.hpp>

#include "device/gemm/chunk_store.cuh"
#include "device/gemm/gemm_config.cuh"
#include "device/gemm/tile_coord.cuh"

namespace caracal::gemm {

// Accumulator columns [64c, 64c + 64) of this thread as bf16 pairs (layout in gemm_config.cuh:
// value 4t' + 2h + v sits at row +8h, column 8t' + 2(l%4) + v).
template <class Accum>
__device__ void pack_accumulator_chunk(Accum const& acc, int c, ChunkWords& out) {
  CUTE_UNROLL
  for (int t = 0; t < 8; ++t) {
    CUTE_UNROLL
    for (int h = 0; h < 2; ++h) {
      int const i = 4 * (8 * c + t) + 2 * h;
      out.w[2 * t + h] = pack_bf16x2(acc(i), acc(i + 1));
    }
  }
}

// Stores the slice at rows [row, row + 64), columns [col0, col0 + N) of `map`'s tensor,
// skipping chunks that start at or past its `cols` columns (the TMA clips a partial one).
// An inactive slice (padding rows only, no wgmma ran) is stored as zeros.
template <class Accum>
__device__ void store_accumulator_bf16(Accum const& acc, bool active, ChunkStoreRing& ring,
                                       CUtensorMap const* map, int cols, int col0, int row) {
  CUTE_UNROLL
  for (int c = 0; c < kTileNOf<Accum> / kChunkCols; ++c) {
    int const col = col0 + c * kChunkCols;
    if (col >= cols) break;
    ChunkWords words{};
    if (active) pack_accumulator_chunk(acc, c, words);
    ring.acquire();
    ring.write(words);
    ring.store(map, col, row);
  }
}

// Row outputs rounded once: y = bf16(hidden · W_down^T), dx = bf16(d_gate_up · W_gate_up).
struct RowsBf16Epilogue {
  struct Params {
    CUtensorMap out;  // bf16 [row_capacity][cols], box 64 x 64
    int cols;
  };

  template <class Accum>
  __device__ static void apply(Params const& p, TileCoord const& tile, Accum const& acc,
                               bool active, ChunkStoreRing& ring, int warpgroup) {
    store_accumulator_bf16(acc, active, ring, &p.out, p.cols, tile.n_begin,
                           tile.m_buffer + warpgroup * kWarpgroupRows);
  }
};

}  // namespace caracal::gemm
