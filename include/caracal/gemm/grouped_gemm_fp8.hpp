#pragma once
// The forward's grouped GEMMs in DeepSeek-V3's FP8 recipe (issue 47): e4m3 operands with fp32
// block scales as caracal/block_fp8.hpp defines them (src/quant's kernels write them), fp32
// accumulators promoted at every 128-wide K block with the block's scales, outputs in bf16 as the
// bf16 GEMMs store theirs. Rows, padding, determinism, graphs and argument errors as
// caracal/gemm/grouped_gemm.hpp says, with these differences: D and I are multiples of 128 (one
// scaling block), the tiles are 128 x 128, and the CTAs run one tile at a time (no pairs).
// Each GEMM's result equals the fp64 GEMM of its dequantized operands (code * scale) to within fp32
// accumulation, before the bf16 rounding of its outputs.
//
// This header stays free of CuTe so plain host code (tests, tools) can include it.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "caracal/gemm/grouped_gemm.hpp"
#include "caracal/schedule_view.hpp"

namespace caracal::gemm {

// D and I must be positive multiples of this.
inline constexpr int kFp8GroupedGemmDimAlignment = 128;

// Rows of e4m3 values [buffer rows][K] and their scales, one per row and 128-wide K block, stored
// K block by K block: scales[kb * buffer rows + r] (quant::QuantizeRowsArgs with scale_row_stride 1,
// scale_block_stride = buffer rows).
struct Fp8RowOperand {
  const __nv_fp8_e4m3* codes = nullptr;
  const float* scales = nullptr;  // [ceil(K / 128)][buffer rows]
};

// Rows written in e4m3 [buffer rows][K] with their 1 x 128 scales, in the layout Fp8RowOperand reads.
struct Fp8RowOutput {
  __nv_fp8_e4m3* codes = nullptr;
  float* scales = nullptr;  // [K / 128][buffer rows]
};

// The tokens' rows in e4m3 where they are (a world of one rank: read in place of rows dispatched
// into schedule order), token t's codes at codes + t * K and its scale of K block kb at
// scales[kb * scale_block_stride + t] (the layout Fp8RowOperand reads, over the tokens).
struct Fp8TokenRows {
  const __nv_fp8_e4m3* codes = nullptr;
  const float* scales = nullptr;
  int64_t scale_block_stride = 0;  // at least the tokens
};

// A row of Fp8WeightOperand's scales holds N block nb's scale at float fp8_weight_scale_at(nb), 16
// bytes apart (a TMA box starts on a 16-byte boundary; the floats between are never read), and is
// fp8_weight_scale_row(ceil(N / 128)) floats long: whole 128-byte boxes.
inline constexpr int64_t kFp8WeightScaleStep = 4;
inline constexpr int64_t fp8_weight_scale_at(int64_t n_block) { return kFp8WeightScaleStep * n_block; }
inline constexpr int64_t fp8_weight_scale_row(int64_t n_blocks) {
  return (kFp8WeightScaleStep * n_blocks + 31) / 32 * 32;
}
static_assert(fp8_weight_scale_at(1) * sizeof(float) == 16, "each block's scale on a 16-byte boundary");

// Expert weights of e4m3 values [L][N][K] and one scale per 128 x 128 block, block (kb, nb) of
// expert e at scales[(e * ceil(K / 128) + kb) * fp8_weight_scale_row(ceil(N / 128)) +
// fp8_weight_scale_at(nb)] (quant::QuantizeWeightsArgs's codes and scales).
struct Fp8WeightOperand {
  const __nv_fp8_e4m3* codes = nullptr;
  const float* scales = nullptr;  // [L][ceil(K / 128)][fp8_weight_scale_row(ceil(N / 128))]
};

// grouped_up_gate_swiglu in FP8: gate_up = bf16(x · W_gate_up^T), the activation from it (F1, F2).
struct Fp8UpGateSwigluArgs {
  ScheduleView rows;
  int hidden = 0;        // D: the K of this GEMM
  int intermediate = 0;  // I: activation_out has I columns, the GEMM N = 2I
  Fp8RowOperand x;             // K = D
  Fp8WeightOperand w_gate_up;  // N = 2I, K = D, interleaved as grouped_gemm.hpp's gate_up_row
  __nv_bfloat16* activation_out = nullptr;  // [buffer rows][I]; nullptr: not stored
  __nv_bfloat16* gate_up_out = nullptr;     // [buffer rows][2I], interleaved; nullptr: not stored
  // The activation in e4m3 (the down GEMM's operand: quant::quantize_rows of activation_out's values,
  // bit for bit), or null codes and scales: not stored. At least one of the activations is asked for.
  Fp8RowOutput activation_fp8_out;
  int num_ctas = 0;                         // persistent CTAs; 0 = one per SM
  uint32_t* tile_queue = nullptr;           // kTileQueueWords words, or nullptr
  // x read where the tokens are instead of from x's rows (a world of one rank: no dispatch_fp8
  // first): schedule row r is route rows.rows[r].y of this rank (token route / top_k; padding rows
  // negative). Then x is null, rows.rows set and top_k >= 1 (the producer warpgroup gathers the
  // rows). The same bits as x's rows dispatched.
  Fp8TokenRows x_tokens;
  int top_k = 0;
};

// grouped_down_proj in FP8: y = bf16(activation · W_down^T) (F3).
struct Fp8DownProjArgs {
  ScheduleView rows;
  int hidden = 0;          // D: the N of this GEMM
  int intermediate = 0;    // I: the K of this GEMM
  Fp8RowOperand activation;      // K = I
  Fp8WeightOperand w_down;       // N = D, K = I
  __nv_bfloat16* y_out = nullptr;  // [buffer rows][D]
  int num_ctas = 0;
  uint32_t* tile_queue = nullptr;
};

// Argument rules: as the bf16 GEMMs', with D and I multiples of 128 and every codes and scales
// pointer non-null (row codes and scales may be null with row_capacity 0) and 16-byte aligned.
void grouped_up_gate_swiglu(const Fp8UpGateSwigluArgs& args, cudaStream_t stream);
void grouped_down_proj(const Fp8DownProjArgs& args, cudaStream_t stream);

}  // namespace caracal::gemm
