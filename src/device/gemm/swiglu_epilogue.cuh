#pragma once
// The up/gate epilogue: gate and up rounded to bf16 (stored when backward needs them), then
// the activation SiLU(gate) * up from the rounded values, rounded to bf16 and stored (contract F1, F2).
//
// The weights are interleaved in groups of kGateUpInterleave = 8 rows (gate_up_row), so
// accumulator column group 2g holds gate columns [8g, 8g + 8) and group 2g + 1 the matching up
// columns: every thread holds gate_j and up_j of the same j, and an N-column tile yields N / 2
// activation columns (whole 64-column chunks: N a multiple of 128) in the same per-thread pattern
// as a plain N / 2-column accumulator.
#include <cute/tensor.hpp>

#include "device/gemm/bf16_epilogue.cuh"
#include "device/gemm/chunk_store.cuh"
#include "device/gemm/gemm_config.cuh"
#include "device/gemm/swiglu_math.cuh"
#include "device/gemm/tile_coord.cuh"

namespace caracal::gemm {

static_assert(kGateUpInterleave == 8, "the SwiGLU epilogue pairs 8-column accumulator groups");

// Hidden columns [64hc, 64hc + 64) of the tile from accumulator columns [128hc, 128hc + 128).
template <class Accum>
__device__ void pack_swiglu_chunk(Accum const& acc, int hc, ChunkWords& out) {
  CUTE_UNROLL
  for (int t = 0; t < 8; ++t) {
    CUTE_UNROLL
    for (int h = 0; h < 2; ++h) {
      int const gate = 4 * (16 * hc + 2 * t) + 2 * h;  // group 2t of the chunk's 16
      int const up = gate + 4;                         // group 2t + 1: the same j
      out.w[2 * t + h] =
          pack_bf16x2(swiglu(round_to_bf16(acc(gate)), round_to_bf16(acc(up))),
                      swiglu(round_to_bf16(acc(gate + 1)), round_to_bf16(acc(up + 1))));
    }
  }
}

struct UpGateSwigluEpilogue {
  struct Params {
    CUtensorMap activation;  // bf16 [row_capacity][I], box 64 x 64
    CUtensorMap gate_up;     // bf16 [row_capacity][2I], box 64 x 64 (if stored)
    int intermediate;        // I
    bool store_gate_up;      // the backward recomputes SwiGLU from the stored gate/up
  };

  template <class Accum>
  __device__ static void apply(Params const& p, TileCoord const& tile, Accum const& acc,
                               bool active, ChunkStoreRing& ring, int warpgroup) {
    int const row = tile.m_buffer + warpgroup * kWarpgroupRows;
    if (p.store_gate_up) {
      store_accumulator_bf16(acc, active, ring, &p.gate_up, 2 * p.intermediate, tile.n_begin, row);
    }
    static_assert(kTileNOf<Accum> % (2 * kChunkCols) == 0, "whole 64-column chunks of the activation");
    CUTE_UNROLL
    for (int hc = 0; hc < kTileNOf<Accum> / (2 * kChunkCols); ++hc) {
      int const col = tile.n_begin / 2 + hc * kChunkCols;
      if (col >= p.intermediate) break;
      ChunkWords words{};  // an inactive slice: SiLU(0) * 0 = 0
      if (active) pack_swiglu_chunk(acc, hc, words);
      ring.acquire();
      ring.write(words);
      ring.store(&p.activation, col, row);
    }
  }
};

}  // namespace caracal::gemm
