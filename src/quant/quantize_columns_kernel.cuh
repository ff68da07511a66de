#pragma once
// The column quantizer's kernel (quantize_fp8.hpp's quantize_columns and quantize_columns_of_e4m3),
// generic over where its values come from: one CTA a 128 x 128 block of the values, a scale per
// column, a thread an 8 x 8 square of it (square_tile.cuh). A column's amax over the block's rows:
// its 8 rows in each square, the quad's 32 rows by shuffles, the four quarters of the rows (warps
// w / 2) through shared memory. The codes leave transposed from byte permutes in registers, 8 bytes
// a column where the layout keeps them 8-byte aligned, else two 4-byte stores.
//
// A memory-bound kernel: its speed is the bytes in flight, so the square stays in registers as
// loaded (Source::Raw: 24 or 32 registers) and is unpacked twice, for the amax and for the codes (the
// same operations both times, so the same floats), which keeps a thread within kColumnCtasPerSm
// CTAs an SM.
#include <cuda_fp8.h>

#include "quant/block_scale.cuh"
#include "quant/quantize_fp8.hpp"
#include "quant/square_tile.cuh"

namespace caracal::quant {

inline constexpr int kColumnBlockSide = static_cast<int>(kFp8Block);

// A source of values: at(row, col) gives a cursor on the 8 values of row `row` from column `col`
// and the rows below (all 8 in the values: cols is a multiple of 8); its load(r) reads row + r's raw,
// kZero stands for 8 zeros, unpack turns either into floats.

// bf16 values [rows][cols] (QuantizeColumnsArgs::values).
struct Bf16ColumnValues {
  using Raw = uint4;
  static constexpr Raw kZero = {0, 0, 0, 0};
  const __nv_bfloat16* values;
  int64_t cols;
  struct Cursor {
    const __nv_bfloat16* first;
    int64_t cols;
    __device__ __forceinline__ Raw load(int r) const { return *reinterpret_cast<const uint4*>(first + r * cols); }
  };
  __device__ __forceinline__ Cursor at(int64_t row, int64_t col) const { return {values + row * cols + col, cols}; }
  __device__ __forceinline__ static void unpack(const Raw& raw, float (&v)[kSquare]) {
    const uint32_t pairs[4] = {raw.x, raw.y, raw.z, raw.w};
    for (int j = 0; j < 4; ++j) {
      const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&pairs[j]));
      v[2 * j] = f.x;
      v[2 * j + 1] = f.y;
    }
  }
};

// e4m3 rows with their 1 x 128 scales (E4m3Rows): each value code * its block's scale, one fp32
// multiplication (caracal/block_fp8.hpp's dequantize_to_float); zeros as code 0 under scale 0.
struct E4m3ColumnValues {
  struct Raw {
    uint2 codes;
    float scale;
  };
  static constexpr Raw kZero = {{0, 0}, 0.0f};
  const __nv_fp8_e4m3* codes;
  const float* scales;
  int64_t scale_block_stride;
  int64_t cols;
  struct Cursor {
    const __nv_fp8_e4m3* first;
    const float* scales;  // the first row's scale of the block; the next rows' follow
    int64_t cols;
    __device__ __forceinline__ Raw load(int r) const {
      return {*reinterpret_cast<const uint2*>(first + r * cols), scales[r]};
    }
  };
  __device__ __forceinline__ Cursor at(int64_t row, int64_t col) const {
    return {codes + row * cols + col, scales + col / kColumnBlockSide * scale_block_stride + row, cols};
  }
  __device__ __forceinline__ static void unpack(const Raw& raw, float (&v)[kSquare]) {
    const uint32_t words[2] = {raw.codes.x, raw.codes.y};
    for (int w = 0; w < 2; ++w) {
      for (int p = 0; p < 2; ++p) {
        const __half2_raw h =
            __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(words[w] >> (16 * p)), __NV_E4M3);
        const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
        v[4 * w + 2 * p] = __fmul_rn(f.x, raw.scale);
        v[4 * w + 2 * p + 1] = __fmul_rn(f.y, raw.scale);
      }
    }
  }
};

// The same e4m3 rows read in place as tokens' rows (E4m3Rows::routes): row r is token
// routes[r].y / top_k's, a negative route a row of zeros.
struct GatheredE4m3ColumnValues {
  using Raw = E4m3ColumnValues::Raw;
  static constexpr Raw kZero = E4m3ColumnValues::kZero;
  const __nv_fp8_e4m3* codes;
  const float* scales;
  int64_t scale_block_stride;
  int64_t cols;
  const int2* routes;
  int top_k;
  struct Cursor {
    const __nv_fp8_e4m3* codes;  // column col of token 0
    const float* scales;         // the block's scale of token 0
    const int2* routes;          // the first row's
    int64_t cols;
    int top_k;
    __device__ __forceinline__ Raw load(int r) const {
      const int route = __ldg(&routes[r].y);
      if (route < 0) return kZero;
      const int64_t token = route / top_k;
      return {*reinterpret_cast<const uint2*>(codes + token * cols), scales[token]};
    }
  };
  __device__ __forceinline__ Cursor at(int64_t row, int64_t col) const {
    return {codes + col, scales + col / kColumnBlockSide * scale_block_stride, routes + row, cols, top_k};
  }
  __device__ __forceinline__ static void unpack(const Raw& raw, float (&v)[kSquare]) {
    E4m3ColumnValues::unpack(raw, v);
  }
};

namespace {  // each unit instantiates its own

constexpr int kSide = kColumnBlockSide;
constexpr int kQuarters = kSide / (4 * kSquare);  // row quarters of a block: 4 (a quad's 32 rows each)
constexpr int kColumnCtasPerSm = 4;               // 64 registers a thread

// `args`' outputs (its values unused) from `source`'s rows.
template <class Source>
__global__ void __launch_bounds__(kSquareThreads, kColumnCtasPerSm)
    quantize_columns_kernel(const QuantizeColumnsArgs args, const Source source) {
  __shared__ float quarter_amax[kQuarters][kSide];
  const int64_t col_blocks = (args.cols + kSide - 1) / kSide;
  const int64_t rb = blockIdx.x / col_blocks, cb = blockIdx.x % col_blocks;
  const int thread = static_cast<int>(threadIdx.x), lane = thread % 32;
  const int row0 = square_row0(thread), col0 = square_col0(thread);
  const int64_t first_row = rb * kSide + row0, first_col = cb * kSide + col0;
  // cols is a multiple of 8 (a square's columns lie wholly inside or outside), rows of 4.
  const int rows_here =
      first_col < args.cols ? static_cast<int>(max(int64_t(0), min(int64_t(kSquare), args.rows - first_row))) : 0;

  typename Source::Raw raw[kSquare];  // row r of the square as loaded; zeros outside the values
  const typename Source::Cursor first = source.at(first_row, first_col);
  for (int r = 0; r < kSquare; ++r) raw[r] = r < rows_here ? first.load(r) : Source::kZero;
  float amax[kSquare];
  for (int j = 0; j < kSquare; ++j) amax[j] = 0.0f;
  for (int r = 0; r < kSquare; ++r) {
    float v[kSquare];  // row r's values
    Source::unpack(raw[r], v);
    for (int j = 0; j < kSquare; ++j) amax[j] = fmaxf(amax[j], fabsf(v[j]));
  }
  for (int j = 0; j < kSquare; ++j) {
    amax[j] = fmaxf(amax[j], __shfl_xor_sync(0xffffffffu, amax[j], 1));
    amax[j] = fmaxf(amax[j], __shfl_xor_sync(0xffffffffu, amax[j], 2));
  }
  const int quarter = thread / 64;  // the quad's rows: 32 quarter .. 32 quarter + 31 of the block
  const int q = lane % 4;           // the quad's lanes share the stores: columns 2q, 2q + 1
  for (int j = 0; j < kSquare; ++j) {
    if (j / 2 == q) quarter_amax[quarter][col0 + j] = amax[j];  // unrolled: amax stays in registers
  }
  __syncthreads();
  float inverse[kSquare];
  for (int j = 0; j < kSquare; ++j) {
    float a = 0.0f;
    for (int h = 0; h < kQuarters; ++h) a = fmaxf(a, quarter_amax[h][col0 + j]);
    const BlockScale s = device_block_scale(a, args.rounding);
    inverse[j] = s.inverse;
    if (row0 == 0 && first_col < args.cols) {  // the squares of the block's first rows store the scales
      args.scales[(first_col + j) * args.scale_col_stride + rb * args.scale_block_stride] = s.scale;
    }
  }
  if (rows_here == 0) return;

  uint32_t codes[kSquare][2];  // row r's columns 4h .. 4h+3
  for (int r = 0; r < kSquare; ++r) {
    float v[kSquare];
    Source::unpack(raw[r], v);
    uint16_t p[4];
    for (int j = 0; j < 4; ++j) p[j] = e4m3_code_pair(v[2 * j], v[2 * j + 1], inverse[2 * j], inverse[2 * j + 1]);
    codes[r][0] = uint32_t(p[0]) | uint32_t(p[1]) << 16;
    codes[r][1] = uint32_t(p[2]) | uint32_t(p[3]) << 16;
  }
  transpose_square(codes);  // codes[4q + c][h]: column 4h + c's rows 4q .. 4q+3
  uint8_t* const out_codes = reinterpret_cast<uint8_t*>(args.codes_t) + first_col * args.codes_row_stride + first_row;
  const bool whole =
      rows_here == kSquare && reinterpret_cast<uintptr_t>(out_codes) % 8 == 0 && args.codes_row_stride % 8 == 0;
  for (int h = 0; h < 2; ++h) {
    for (int c = 0; c < 4; ++c) {
      uint8_t* const column = out_codes + (4 * h + c) * args.codes_row_stride;
      if (whole) {
        *reinterpret_cast<uint2*>(column) = make_uint2(codes[c][h], codes[4 + c][h]);
      } else {
        *reinterpret_cast<uint32_t*>(column) = codes[c][h];
        if (rows_here == kSquare) *reinterpret_cast<uint32_t*>(column + 4) = codes[4 + c][h];
      }
    }
  }
}

}  // namespace

// The checks both launchers share (`where` names the function), and the grid: a CTA a block.
int column_blocks(const QuantizeColumnsArgs& args, const char* where);

// quantize_columns_of_e4m3 of rows with routes (quantize_columns_e4m3_gathered.cu), checked, on
// `blocks` CTAs.
void quantize_columns_of_gathered_e4m3(const QuantizeColumnsArgs& args, const E4m3Rows& rows, int blocks,
                                       cudaStream_t stream);

}  // namespace caracal::quant
