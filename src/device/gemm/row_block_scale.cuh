#pragma once
// The scale of a 1 x 128 block of a row held in a consumer quad's accumulator pattern, as the FP8
// epilogues quantize their bf16 outputs (swiglu_fp8_epilogue.cuh, swiglu_backward_fp8_epilogue.cuh):
// each lane holds 32 of the row's 128 values in two chunks' bf16 words, the row h of its two at
// words[c].w[2t + h]; the block's amax is the largest magnitude over the lane's values, then over
// the quad by two shuffles (fmaxf: a NaN does not count, as in the quantizer), and its scale
// quant::device_exact_block_scale's: quant::quantize_rows' bits.
#include <cute/tensor.hpp>

#include "device/common/bf16_pairs.cuh"
#include "device/gemm/chunk_store.cuh"
#include "quant/block_scale.cuh"

namespace caracal::gemm {

__device__ inline BlockScale quad_row_block_scale(ChunkWords const (&words)[2], int h) {
  float amax = 0.0f;
  CUTE_UNROLL
  for (int c = 0; c < 2; ++c) {
    CUTE_UNROLL
    for (int t = 0; t < 8; ++t) {
      uint32_t const w = words[c].w[2 * t + h];
      amax = fmaxf(amax, fabsf(bf16_low(w)));
      amax = fmaxf(amax, fabsf(bf16_high(w)));
    }
  }
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
  return quant::device_exact_block_scale(amax);
}

}  // namespace caracal::gemm
