#pragma once
// The FP8 dgrad's epilogue (issue 47): SwigluBackwardEpilogue's outputs for the FP8 policies'
// 128- or 256-column tiles (d_gate_up in bf16, the weight gradients' operand; the scaled activation;
// the dL/dg partials, one per row and N tile), and d_gate_up once more in e4m3 with one
// fp32 scale per row and 1 x 128 block along 2I: the dx GEMM's A operand (Fp8RowOperand of
// caracal/gemm/grouped_gemm_fp8.hpp). The codes and scales are quant::quantize_rows of the stored
// bf16 d_gate_up with exact scales, bit for bit: caracal/block_fp8.hpp's rule on the same bf16
// values, the scales without a division (quant/exact_block_scale.hpp: a division's slow-path call
// here spills the accumulators).
//
// A chunk of 64 d_h columns yields 128 d_gate_up columns (gate_up order), one scaling block, whose
// scale per row is quad_row_block_scale's (row_block_scale.cuh). An inactive slice stores zero
// codes and the scale of an all-zero block, as the quantizer makes of its zero bf16 rows.
#include <cstdint>

#include <cute/tensor.hpp>

#include "caracal/block_fp8.hpp"
#include "device/gemm/chunk_store.cuh"
#include "device/gemm/gemm_config.cuh"
#include "device/gemm/gemm_policy.cuh"
#include "device/gemm/row_block_scale.cuh"
#include "device/gemm/swiglu_backward_epilogue.cuh"
#include "device/gemm/tile_coord.cuh"
#include "quant/block_scale.cuh"

namespace caracal::gemm {

// One 1 x 128 block of each of the thread's two rows, the bf16 words of the chunk's two halves
// (`grad[half]` as swiglu_backward_half leaves them): the rows' scales and the codes in
// ChunkStoreRing::write_e4m3's pattern (d_h group t = 4 half + q: gate pair low, up pair high).
__device__ inline void quantize_d_gate_up_block(ChunkWords const (&grad)[2], ChunkWords& codes, float (&scale)[2]) {
  CUTE_UNROLL
  for (int h = 0; h < 2; ++h) {
    BlockScale const s = quad_row_block_scale(grad, h);
    scale[h] = s.scale;
    CUTE_UNROLL
    for (int half = 0; half < 2; ++half) {
      CUTE_UNROLL
      for (int q = 0; q < kHalfGroups; ++q) {
        uint32_t const gate = grad[half].w[2 * (2 * q) + h], up = grad[half].w[2 * (2 * q + 1) + h];
        uint32_t const gate_codes = quant::e4m3_code_pair(bf16_low(gate), bf16_high(gate), s.inverse);
        uint32_t const up_codes = quant::e4m3_code_pair(bf16_low(up), bf16_high(up), s.inverse);
        codes.w[2 * (kHalfGroups * half + q) + h] = gate_codes | up_codes << 16;
      }
    }
  }
}

template <int TileN, bool LoadAhead>
struct SwigluBackwardFp8EpilogueOf {
  // The tile's N. I is a multiple of 128 (the launcher checks): a 256-column tile may end past I,
  // its chunks there skipped.
  static constexpr int kTileN = TileN;
  // The next chunk's first half chunk of gate/up pairs loaded while this one's outputs are stored
  // (16 registers a thread), or each half chunk's just before its use.
  static constexpr bool kLoadAhead = LoadAhead;
  static_assert(kTileN % kScaleBlock == 0, "whole scaling blocks of d_h a tile");

  struct Params {
    SwigluBackwardEpilogue::Params swiglu;  // the bf16 outputs, gate_up, g, the dg partials
    CUtensorMap d_gate_up_codes;             // e4m3 [buffer rows][2I], box 64 x 128
    float* d_gate_up_scales;                 // [2I / 128][buffer rows]
    int buffer_rows;
  };

  // Producer: the tile's 128 rows x 256 columns of gate_up into L2 (mainloop.cuh says when).
  __device__ static void prefetch_source(Params const& p, TileCoord const& tile) {
    prefetch_gate_up<kTileN>(p.swiglu, tile);
  }

  template <class Accum>
  __device__ static void apply(Params const& p, TileCoord const& tile, Accum const& acc, bool active,
                               ChunkStoreRing& ring, int warpgroup) {
    static_assert(kTileNOf<Accum> == kTileN, "the accumulators of the FP8 policy's tile");
    static_assert(2 * kChunkCols == kScaleBlock, "a d_h chunk's d_gate_up is one scaling block");
    SwigluBackwardEpilogue::Params const& b = p.swiglu;
    SwigluBackwardRows const r = swiglu_backward_rows(tile, warpgroup);
    const uint32_t* src[2];
    float g[2] = {0.0f, 0.0f};
    gate_up_sources(b, tile, r, b.intermediate, active, src, g);

    static_assert(!kLoadAhead || kTileN == kScaleBlock, "loads ahead over whole tiles of I only");
    GateUpPairs ahead;  // the next chunk's first half
    if constexpr (kLoadAhead) {
      if (active) load_gate_up_pairs(src, 0, ahead);
    }
    float dg[2] = {0.0f, 0.0f};
    CUTE_UNROLL
    for (int hc = 0; hc < kTileN / kChunkCols; ++hc) {
      if constexpr (kTileN > kScaleBlock) {
        if (tile.n_begin + hc * kChunkCols >= b.intermediate) break;
      }
      int const col = 2 * (tile.n_begin + hc * kChunkCols);  // the block's first d_gate_up column
      ChunkWords grad_words[2] = {};  // an inactive slice stores zeros
      ChunkWords activation_words{};
      if (active) {
        CUTE_UNROLL
        for (int half = 0; half < 2; ++half) {
          int const group0 = kDhChunkGroups * hc + kHalfGroups * half;
          if constexpr (kLoadAhead) {
            if (half == 0) {
              swiglu_backward_half(acc, ahead, g, group0, half, dg, grad_words[half], activation_words);
            } else {
              swiglu_backward_half(acc, src, g, group0, half, dg, grad_words[half], activation_words);
            }
          } else {
            swiglu_backward_half(acc, src, g, group0, half, dg, grad_words[half], activation_words);
          }
        }
        if constexpr (kLoadAhead) {
          if (hc + 1 < kTileN / kChunkCols) load_gate_up_pairs(src, kDhChunkGroups * (hc + 1), ahead);
        }
      }
      CUTE_UNROLL
      for (int half = 0; half < 2; ++half) {
        ring.acquire();
        ring.write(grad_words[half]);
        ring.store(&b.d_gate_up, col + half * kChunkCols, r.block_row);
      }
      ring.acquire();
      ring.write(activation_words);
      ring.store(&b.scaled_activation, tile.n_begin + hc * kChunkCols, r.block_row);
      ChunkWords codes;
      float scale[2];
      quantize_d_gate_up_block(grad_words, codes, scale);
      ring.acquire();
      ring.write_e4m3(codes);
      ring.store(&p.d_gate_up_codes, col, r.block_row);
      if (r.lane % 4 == 0) {
        float* const scales = p.d_gate_up_scales + int64_t(col / kScaleBlock) * p.buffer_rows + r.buffer_row;
        scales[0] = scale[0];
        scales[8] = scale[1];
      }
    }
    store_dg_partials(b, r, dg, tile.n_begin / kTileN);
  }
};

// The two tiles the FP8 dgrad comes in (src/gemm/down_dgrad_swiglu_fp8.cu picks by shape).
// The wide kernel loads in place: it spills with any more live registers in its epilogue.
using SwigluBackwardFp8Epilogue = SwigluBackwardFp8EpilogueOf<Fp8BlockScaledGemmPolicy::kBlockN, true>;
using SwigluBackwardFp8WideEpilogue = SwigluBackwardFp8EpilogueOf<Fp8BlockScaledWideGemmPolicy::kBlockN, false>;

}  // namespace caracal::gemm
