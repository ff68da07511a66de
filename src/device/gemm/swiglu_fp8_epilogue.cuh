#pragma once
// The FP8 up/gate's epilogue (issue 47): UpGateSwigluEpilogue's outputs, each where asked for
// (gate_up in bf16 for the backward; the bf16 activation), and the activation in e4m3 with one
// fp32 scale per row and 1 x 128 block along I: the down GEMM's A operand (Fp8RowOperand of
// caracal/gemm/grouped_gemm_fp8.hpp), so that no launch quantizes it apart. The codes and scales
// are quant::quantize_rows of the bf16 activation with exact scales, bit for bit (caracal/
// block_fp8.hpp's rule on the same bf16 values; the scale without a division, as
// SwigluBackwardFp8Epilogue's).
//
// A 128 x 256 tile's 128 activation columns are one scaling block: its two 64-column chunks, whose
// scale per row is quad_row_block_scale's (row_block_scale.cuh). An inactive slice stores zero
// codes and the scale of an all-zero block, as the quantizer makes of its zero bf16 rows.
#include <cstdint>

#include <cute/tensor.hpp>

#include "caracal/block_fp8.hpp"
#include "device/common/bf16_pairs.cuh"
#include "device/gemm/chunk_store.cuh"
#include "device/gemm/gemm_config.cuh"
#include "device/gemm/gemm_policy.cuh"
#include "device/gemm/row_block_scale.cuh"
#include "device/gemm/swiglu_epilogue.cuh"
#include "device/gemm/tile_coord.cuh"
#include "quant/block_scale.cuh"

namespace caracal::gemm {

// The block's scales of the thread's two rows (h: row 16w + l/4 + 8h) and its codes in
// ChunkStoreRing::write_e4m3's pattern, from the two activation chunks' bf16 words (`act[hc]` as
// pack_swiglu_chunk leaves them: w[2t' + h] holds columns 64hc + 8t' + 2(l%4), +1). The e4m3 word
// t holds columns 16t + 2(l%4), +1 (chunk t / 4, word t' = 2(t % 4)) and 16t + 8 + 2(l%4), +1
// (t' + 1).
__device__ inline void quantize_activation_block(ChunkWords const (&act)[2], ChunkWords& codes, float (&scale)[2]) {
  CUTE_UNROLL
  for (int h = 0; h < 2; ++h) {
    BlockScale const s = quad_row_block_scale(act, h);
    scale[h] = s.scale;
    CUTE_UNROLL
    for (int t = 0; t < 8; ++t) {
      uint32_t const low = act[t / 4].w[2 * (2 * (t % 4)) + h];
      uint32_t const high = act[t / 4].w[2 * (2 * (t % 4) + 1) + h];
      codes.w[2 * t + h] = uint32_t(quant::e4m3_code_pair(bf16_low(low), bf16_high(low), s.inverse)) |
                           uint32_t(quant::e4m3_code_pair(bf16_low(high), bf16_high(high), s.inverse)) << 16;
    }
  }
}

struct UpGateSwigluFp8Epilogue {
  // The tile's N: 256 gate_up columns, 128 activation columns, one scaling block.
  static constexpr int kTileN = 2 * kScaleBlock;

  struct Params {
    UpGateSwigluEpilogue::Params swiglu;  // gate_up (where store_gate_up) and the bf16 activation
    bool store_activation;                // the bf16 activation (swiglu.activation)
    bool store_activation_codes;          // the e4m3 activation and its scales
    CUtensorMap activation_codes;         // e4m3 [buffer rows][I], box 64 x 128
    float* activation_scales;             // [I / 128][buffer rows]
    int buffer_rows;
  };

  template <class Accum>
  __device__ static void apply(Params const& p, TileCoord const& tile, Accum const& acc, bool active,
                               ChunkStoreRing& ring, int warpgroup) {
    static_assert(kTileNOf<Accum> == kTileN, "one scaling block of the activation a tile");
    static_assert(2 * kChunkCols == kScaleBlock, "two activation chunks a scaling block");
    int const block_row = tile.m_buffer + warpgroup * kWarpgroupRows;
    if (p.swiglu.store_gate_up) {
      store_accumulator_bf16(acc, active, ring, &p.swiglu.gate_up, 2 * p.swiglu.intermediate, tile.n_begin, block_row);
    }
    int const col = tile.n_begin / 2;  // the block's first activation column
    ChunkWords act[2] = {};            // an inactive slice: SiLU(0) * 0 = 0
    if (active) {
      CUTE_UNROLL
      for (int hc = 0; hc < 2; ++hc) pack_swiglu_chunk(acc, hc, act[hc]);
    }
    if (p.store_activation) {
      CUTE_UNROLL
      for (int hc = 0; hc < 2; ++hc) {
        ring.acquire();
        ring.write(act[hc]);
        ring.store(&p.swiglu.activation, col + hc * kChunkCols, block_row);
      }
    }
    if (!p.store_activation_codes) return;
    ChunkWords codes;
    float scale[2];
    quantize_activation_block(act, codes, scale);
    ring.acquire();
    ring.write_e4m3(codes);
    ring.store(&p.activation_codes, col, block_row);
    int const thread = int(threadIdx.x) % kWarpgroupThreads;
    if (thread % 4 == 0) {
      float* const scales = p.activation_scales + int64_t(col / kScaleBlock) * p.buffer_rows + block_row +
                            16 * (thread / 32) + (thread % 32) / 4;
      scales[0] = scale[0];
      scales[8] = scale[1];
    }
  }
};

}  // namespace caracal::gemm
