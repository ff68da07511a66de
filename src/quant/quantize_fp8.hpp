#pragma once
// The FP8 recipe's quantizing kernels (issue 47): bf16 rows into e4m3 codes with one fp32 scale per
// 1 x 128 block along the row or, transposed, down the columns; bf16 expert weights into e4m3
// codes with one scale per 128 x 128 block, in both orientations. They meet caracal/block_fp8.hpp's
// contract bit for bit (same fp32 operations, same order), which the GPU tests check against the
// host functions.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <vector_types.h>  // int2

#include <cstdint>

#include "caracal/block_fp8.hpp"
#include "caracal/gemm/grouped_gemm_fp8.hpp"

namespace caracal::quant {

// rows x cols bf16 values (row stride cols) into codes (row stride cols) and the scale of block b
// of row r at scales[r * scale_row_stride + b * scale_block_stride]: row-major scales
// (stride ceil(cols/128), 1) or the GEMMs' MN-major ones (1, the rows of the buffer).
struct QuantizeRowsArgs {
  const __nv_bfloat16* values = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;  // a multiple of 4
  __nv_fp8_e4m3* codes = nullptr;
  float* scales = nullptr;
  int64_t scale_row_stride = 0;
  int64_t scale_block_stride = 0;
  ScaleRounding rounding = ScaleRounding::kExact;
};

// Floats per row of a weight scale matrix of `blocks` blocks, and where block b's scale lies in
// it: the GEMMs' layout (gemm::Fp8WeightOperand).
inline constexpr int64_t weight_scale_row(int64_t blocks) { return gemm::fp8_weight_scale_row(blocks); }
inline constexpr int64_t weight_scale_at(int64_t block) { return gemm::fp8_weight_scale_at(block); }
inline constexpr int64_t weight_blocks(int64_t extent) { return (extent + kFp8Block - 1) / kFp8Block; }

// experts x [n][k] bf16 weights (the GEMMs' K-major B: n output columns, k the reduction) into
//   codes    [experts][n][k]  and scales   [experts][blocks(k)][weight_scale_row(blocks(n))]
//   codes_t  [experts][k][n]  and scales_t [experts][blocks(n)][weight_scale_row(blocks(k))]
// (block b of a row at weight_scale_at(b); the floats between are not written)
// (the transposed copy for the GEMMs that reduce over n); either pair may be null; codes and
// codes_t 8-byte aligned. A block's codes and scale are the same in both orientations.
struct QuantizeWeightsArgs {
  const __nv_bfloat16* weights = nullptr;
  int64_t experts = 0;
  int64_t n = 0;  // a multiple of 8
  int64_t k = 0;  // a multiple of 8
  __nv_fp8_e4m3* codes = nullptr;
  float* scales = nullptr;
  __nv_fp8_e4m3* codes_t = nullptr;
  float* scales_t = nullptr;
  ScaleRounding rounding = ScaleRounding::kExact;
};

// rows x cols bf16 values (row stride cols) quantized down the columns, for the GEMMs that reduce
// over the rows (the weight gradients: FP8 wgmma takes K-major operands only): the values of
// column c in rows 128b .. 128b+127 are one 1 x 128 block. The codes are written transposed, value
// (r, c) at codes_t[c * codes_row_stride + r], and the block's scale at
// scales[c * scale_col_stride + b * scale_block_stride].
struct QuantizeColumnsArgs {
  const __nv_bfloat16* values = nullptr;
  int64_t rows = 0;  // a multiple of 4
  int64_t cols = 0;  // a multiple of 8
  __nv_fp8_e4m3* codes_t = nullptr;
  int64_t codes_row_stride = 0;  // at least rows, a multiple of 4
  float* scales = nullptr;
  int64_t scale_col_stride = 0;
  int64_t scale_block_stride = 0;
  ScaleRounding rounding = ScaleRounding::kExact;
};

// e4m3 rows [rows][cols] with one scale per 1 x 128 block, block b of row r at
// scales[b * scale_block_stride + r] (the FP8 GEMMs' MN-major layout): the source of
// quantize_columns_of_e4m3.
struct E4m3Rows {
  const __nv_fp8_e4m3* codes = nullptr;  // 16-byte aligned
  const float* scales = nullptr;
  int64_t scale_block_stride = 0;  // at least rows (with routes: at least the tokens)
  // Optional: the rows are tokens' rows read in place, row r being token routes[r].y / top_k's (a
  // negative route: a row of zeros), codes and scales then over the tokens (quantize_columns_of_e4m3
  // of rows gathered in the schedule's order; the FP8 weight gradients' x in a world of one rank).
  const int2* routes = nullptr;
  int top_k = 0;
};

// Enqueue on `stream`. Throw caracal::Error naming the argument that is wrong (null pointers where
// work is asked for, sizes, strides, alignment) or when the launch fails.
void quantize_rows(const QuantizeRowsArgs& args, cudaStream_t stream);
void quantize_weights(const QuantizeWeightsArgs& args, cudaStream_t stream);
void quantize_columns(const QuantizeColumnsArgs& args, cudaStream_t stream);
// quantize_columns of `rows`' values (caracal/block_fp8.hpp's dequantize_to_float: code * scale in
// fp32), args.values null and args.cols a multiple of 128: DeepSeek-V3's requantization of rows
// kept in e4m3 for the weight gradients, which read them down the columns.
void quantize_columns_of_e4m3(const QuantizeColumnsArgs& args, const E4m3Rows& rows, cudaStream_t stream);

}  // namespace caracal::quant
