#pragma once
// The epilogue of the down projection's dgrad: SwiGLU backward fused with the router-score
// gradient (DESIGN §3, contract B1, B2, B5 of caracal/reference.hpp). Per row r with weight
// g = g_r, the tile's fp32 accumulators hold d_h = dy_r · W_down[e] (dy not scaled by g), and
//   act           = bf16(SiLU(gate) * up), recomputed from the saved bf16 gate/up exactly as the
//                   forward epilogue computed it (swiglu_math.cuh)
//   dg partial    = <d_h, act> over the tile's columns: the dot product is taken before g is
//                   applied, so dL/dg is exact where g = 0 and nothing divides by g
//   d_gate        = bf16(g d_h * up * SiLU'(gate)),  d_up = bf16(g d_h * SiLU(gate)), stored in
//                   the interleaved gate_up column order (they feed the dx and weight GEMMs)
//   scaled_activation = bf16(g * act): the down weight gradient's operand, which thus carries g
// Each (row, N tile) partial of dg is written once to dg_partials[row][n_block]; a fixed-order
// pass (router_grad_reduce) adds a row's partials. No atomics anywhere.
//
// The thread holding d_h column j also needs gate_j and up_j: with the 8-row interleave they are
// the bf16 pairs at gate_up columns 16t + 2(l%4) and 16t + 8 + 2(l%4) of the tile's 2N columns
// for accumulator group t, read straight from global memory (the producer prefetched them into
// L2 shortly before), half a chunk ahead of their use where the consumers have the registers. The
// pieces below the epilogue serve any tile N (this epilogue's 256, the bf16 policy's;
// swiglu_backward_fp8_epilogue.cuh's 128).
#include <cstdint>

#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/tensor.hpp>

#include "device/common/bf16_pairs.cuh"

#include "device/gemm/chunk_store.cuh"
#include "device/gemm/gemm_config.cuh"
#include "device/gemm/swiglu_math.cuh"
#include "device/gemm/tile_coord.cuh"

namespace caracal::gemm {

static_assert(kGateUpInterleave == 8, "the SwiGLU backward pairs 8-column accumulator groups");

inline constexpr int kDhChunkGroups = kChunkCols / 8;  // accumulator groups of a 64-column chunk
// Half a d_h chunk: the groups behind one 64-column chunk of d_gate_up.
inline constexpr int kHalfGroups = kDhChunkGroups / 2;

// This thread's saved gate and up pairs for the groups of half a d_h chunk: [2q + h] for group q,
// row +8h.
struct GateUpPairs {
  uint32_t gate[2 * kHalfGroups];
  uint32_t up[2 * kHalfGroups];
};

// What one d_h element turns into.
struct SwigluGrad {
  float d_gate, d_up, scaled_activation, dg_term;
};

__device__ inline SwigluGrad swiglu_backward(float d_h, float gate, float up, float g) {
  float const s = sigmoid(gate);
  float const silu_gate = silu(gate, s);
  float const act = round_to_bf16(__fmul_rn(silu_gate, up));  // = the forward's bf16 activation
  float const d_silu = fmaf(silu_gate, 1.0f - s, s);         // SiLU'(x) = s + SiLU(x)(1 - s)
  float const d_activation = g * d_h;
  return {d_activation * up * d_silu, d_activation * silu_gate, g * act, d_h * act};
}

struct SwigluBackwardEpilogue {
  struct Params {
    CUtensorMap d_gate_up;      // bf16 [buffer rows][2I], box 64 x 64
    CUtensorMap scaled_activation;  // bf16 [buffer rows][I], box 64 x 64: bf16(g * SwiGLU)
    CUtensorMap gate_up_source;     // the saved gate_up [buffer rows][2I], box 128 x 64, prefetched
                                    // into L2 ahead of the epilogue
    const __nv_bfloat16* gate_up;   // the same, read by the epilogue
    const float* row_gates;         // [row_capacity] g per schedule row
    float* dg_partials;             // [row_capacity][n_blocks], per schedule row
    int intermediate;               // I
    int n_blocks;                   // N blocks of the GEMM (N = I)
  };

  // Producer: pull the tile's 128 rows x 512 columns of gate_up into L2 (mainloop.cuh says when).
  __device__ static void prefetch_source(Params const& p, TileCoord const& tile);

  // kLoadAhead: each half chunk's gate/up pairs are loaded while the one before is stored (16 more
  // registers a thread); else just before their use (for consumers without those registers).
  template <bool kLoadAhead = true, class Accum>
  __device__ static void apply(Params const& p, TileCoord const& tile, Accum const& acc,
                               bool active, ChunkStoreRing& ring, int warpgroup);
};

// The tile's 128 rows x 2 kTileN columns of gate_up into L2.
template <int kTileN>
__device__ void prefetch_gate_up(SwigluBackwardEpilogue::Params const& p, TileCoord const& tile) {
  CUTE_UNROLL
  for (int c = 0; c < 2 * kTileN / kChunkCols; ++c) {
    int const col = 2 * tile.n_begin + c * kChunkCols;
    if (col >= 2 * p.intermediate) break;
    cute::SM90_TMA_LOAD_2D::PREFETCH::copy(&p.gate_up_source, col, tile.m_buffer);
  }
}

// A consumer thread's two rows: `row` and row + 8 of its warpgroup's 64-row slice
// (gemm_config.cuh's pattern).
struct SwigluBackwardRows {
  int lane;
  int block_row;   // the slice's first row in the row buffers
  int row;         // the thread's first row in the schedule
  int buffer_row;  // and in the row buffers
};

__device__ inline SwigluBackwardRows swiglu_backward_rows(TileCoord const& tile, int warpgroup) {
  int const thread = int(threadIdx.x) % kWarpgroupThreads;
  int const lane = thread % 32;
  int const slice_row = 16 * (thread / 32) + lane / 4;  // and +8, in the warpgroup's 64 rows
  int const block_row = tile.m_buffer + warpgroup * kWarpgroupRows;
  int const row = tile.m_begin + warpgroup * kWarpgroupRows + slice_row;
  int const buffer_row = block_row + slice_row;
  return {lane, block_row, row, buffer_row};
}

// What the thread reads of its rows: src[h], row buffer_row + 8h of gate_up as bf16 pairs (I words,
// `intermediate` = p.intermediate) at the thread's word of the tile's group 0 (its gate pair of group
// t sits at word 8t, 16t + 2(l%4) in bf16, its up pair 4 words later); g[h], the row's g, left as
// it is where the slice is inactive.
__device__ inline void gate_up_sources(SwigluBackwardEpilogue::Params const& p, TileCoord const& tile,
                                       SwigluBackwardRows const& r, int intermediate, bool active,
                                       const uint32_t* (&src)[2], float (&g)[2]) {
  CUTE_UNROLL
  for (int h = 0; h < 2; ++h) {
    src[h] = reinterpret_cast<const uint32_t*>(p.gate_up) + int64_t(r.buffer_row + 8 * h) * intermediate +
             tile.n_begin + r.lane % 4;
    // Through L2, not the read-only path: the fused backward's comm CTAs write the gates during
    // its launch (before the tile's readiness counter).
    if (active) g[h] = __ldcg(p.row_gates + r.row + 8 * h);
  }
}

// The thread's gate and up pairs for half a d_h chunk, accumulator groups [group0, group0 +
// kHalfGroups).
__device__ inline void load_gate_up_pairs(const uint32_t* const (&src)[2], int group0, GateUpPairs& pairs) {
  CUTE_UNROLL
  for (int q = 0; q < kHalfGroups; ++q) {
    CUTE_UNROLL
    for (int h = 0; h < 2; ++h) {
      pairs.gate[2 * q + h] = __ldg(src[h] + 8 * (group0 + q));
      pairs.up[2 * q + h] = __ldg(src[h] + 8 * (group0 + q) + 4);
    }
  }
}

// Half a 64-column d_h chunk, accumulator groups [group0, group0 + kHalfGroups) with their `pairs`:
// their d_gate_up, one 64-column chunk in gate_up order, into `grad_words`; their scaled activation
// into half `half` of `activation_words`; their dg terms added to `dg`.
template <class Accum>
__device__ void swiglu_backward_half(Accum const& acc, GateUpPairs const& pairs, float const (&g)[2], int group0,
                                     int half, float (&dg)[2], ChunkWords& grad_words, ChunkWords& activation_words) {
  CUTE_UNROLL
  for (int q = 0; q < kHalfGroups; ++q) {
    CUTE_UNROLL
    for (int h = 0; h < 2; ++h) {
      int const i = 4 * (group0 + q) + 2 * h;
      uint32_t const gp = pairs.gate[2 * q + h], up = pairs.up[2 * q + h];
      SwigluGrad const lo = swiglu_backward(acc(i), bf16_low(gp), bf16_low(up), g[h]);
      SwigluGrad const hi = swiglu_backward(acc(i + 1), bf16_high(gp), bf16_high(up), g[h]);
      dg[h] += lo.dg_term;
      dg[h] += hi.dg_term;
      // Output group 2q holds d_gate of the d_h group, 2q + 1 its d_up (gate_up order).
      grad_words.w[2 * (2 * q) + h] = pack_bf16x2(lo.d_gate, hi.d_gate);
      grad_words.w[2 * (2 * q + 1) + h] = pack_bf16x2(lo.d_up, hi.d_up);
      activation_words.w[2 * (kHalfGroups * half + q) + h] = pack_bf16x2(lo.scaled_activation, hi.scaled_activation);
    }
  }
}

// The same, its pairs loaded here.
template <class Accum>
__device__ void swiglu_backward_half(Accum const& acc, const uint32_t* const (&src)[2], float const (&g)[2], int group0,
                                     int half, float (&dg)[2], ChunkWords& grad_words, ChunkWords& activation_words) {
  GateUpPairs pairs;
  load_gate_up_pairs(src, group0, pairs);
  swiglu_backward_half(acc, pairs, g, group0, half, dg, grad_words, activation_words);
}

// The four lanes of a row hold disjoint columns: add them in a fixed butterfly (every lane ends
// with the same bits), then one lane writes the row's partial of N block `n_block`.
__device__ inline void store_dg_partials(SwigluBackwardEpilogue::Params const& p, SwigluBackwardRows const& r,
                                         float const (&dg)[2], int n_block) {
  CUTE_UNROLL
  for (int h = 0; h < 2; ++h) {
    float s = dg[h];
    s += __shfl_xor_sync(0xffffffffu, s, 1);
    s += __shfl_xor_sync(0xffffffffu, s, 2);
    if (r.lane % 4 == 0) p.dg_partials[int64_t(r.row + 8 * h) * p.n_blocks + n_block] = s;
  }
}

__device__ inline void SwigluBackwardEpilogue::prefetch_source(Params const& p, TileCoord const& tile) {
  prefetch_gate_up<kBlockN>(p, tile);
}

template <bool kLoadAhead, class Accum>
__device__ void SwigluBackwardEpilogue::apply(Params const& p, TileCoord const& tile, Accum const& acc, bool active,
                                              ChunkStoreRing& ring, int warpgroup) {
  constexpr int kTileN = kTileNOf<Accum>;
  SwigluBackwardRows const r = swiglu_backward_rows(tile, warpgroup);
  int const intermediate = p.intermediate;
  const uint32_t* src[2];
  float g[2] = {0.0f, 0.0f};
  gate_up_sources(p, tile, r, intermediate, active, src, g);

  // Half chunk j (groups kHalfGroups j) exists where its 64 columns start below I.
  constexpr int kHalfChunks = 2 * kTileN / kChunkCols;
  GateUpPairs pairs;
  if (kLoadAhead && active) load_gate_up_pairs(src, 0, pairs);
  float dg[2] = {0.0f, 0.0f};
  CUTE_UNROLL
  for (int hc = 0; hc < kTileN / kChunkCols; ++hc) {
    if (tile.n_begin + hc * kChunkCols >= intermediate) break;
    ChunkWords activation_words{};  // an inactive slice stores zeros
    CUTE_UNROLL
    for (int half = 0; half < 2; ++half) {
      int const j = 2 * hc + half;
      ChunkWords grad_words{};
      if (active) {
        if constexpr (kLoadAhead) {
          swiglu_backward_half(acc, pairs, g, kHalfGroups * j, half, dg, grad_words, activation_words);
          bool const next_exists = tile.n_begin + ((j + 1) / 2) * kChunkCols < intermediate;
          if (j + 1 < kHalfChunks && next_exists) load_gate_up_pairs(src, kHalfGroups * (j + 1), pairs);
        } else {
          swiglu_backward_half(acc, src, g, kHalfGroups * j, half, dg, grad_words, activation_words);
        }
      }
      ring.acquire();
      ring.write(grad_words);
      ring.store(&p.d_gate_up, 2 * (tile.n_begin + hc * kChunkCols) + half * kChunkCols, r.block_row);
    }
    ring.acquire();
    ring.write(activation_words);
    ring.store(&p.scaled_activation, tile.n_begin + hc * kChunkCols, r.block_row);
  }
  int const n_block = tile.n_begin / kTileN;
  store_dg_partials(p, r, dg, n_block);
}

}  // namespace caracal::gemm
