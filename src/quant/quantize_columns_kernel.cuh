#pragma once
// The column quantizer's kernel (quantize_fp8.hpp's quantize_columns and quantize_columns_of_e4m3),
// generic over where its values come from: one CTA a 128 x 128 block of the values, a scale per
// column. A thread holds 8 rows x one 16-byte unit of them (Source::kUnitCols columns: 16 e4m3
// codes or 8 bf16 values); a warp holds 4 row groups x 8 units, so each of its row loads reads four
// whole 128-byte lines, and each of its transposed code stores writes 32-byte sectors. A column's
// amax: its thread's 8 rows, then the block's 16 row groups through shared memory, where thread
// c < 128 forms column c's scale (the warp's scale stores one run) and its inverse. The codes leave
// transposed from byte permutes in registers, a column's 8 codes an 8-byte store where the layout
// keeps them 8-byte aligned, else two 4-byte ones.
//
// A memory-bound kernel: its speed is the bytes in flight, so the unit stays in registers as loaded
// (Source::Raw) and is unpacked twice, for the amax and for the codes (the same operations both
// times, so the same floats; hide_from_reuse keeps the compiler from holding the first ones), which
// keeps a thread within kColumnCtasPerSm's registers.
#include <cuda_fp8.h>

#include "quant/block_scale.cuh"
#include "quant/quantize_fp8.hpp"
#include "quant/square_tile.cuh"

namespace caracal::quant {

inline constexpr int kColumnBlockSide = static_cast<int>(kFp8Block);

// A source of values: at(row, col) gives a cursor on the kUnitCols values of row `row` from column
// `col` and the rows below (all in the values: cols is a multiple of kUnitCols); its load(r) reads
// row + r's raw, kZero stands for zeros, unpack turns either into floats.

// bf16 values [rows][cols] (QuantizeColumnsArgs::values).
struct Bf16ColumnValues {
  static constexpr int kUnitCols = 8;
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
  __device__ __forceinline__ static void unpack(const Raw& raw, float (&v)[kUnitCols]) {
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
  static constexpr int kUnitCols = 16;
  struct Raw {
    uint4 codes;
    float scale;
  };
  static constexpr Raw kZero = {{0, 0, 0, 0}, 0.0f};
  const __nv_fp8_e4m3* codes;
  const float* scales;
  int64_t scale_block_stride;
  int64_t cols;
  struct Cursor {
    const __nv_fp8_e4m3* first;
    const float* scales;  // the first row's scale of the block; the next rows' follow
    int64_t cols;
    __device__ __forceinline__ Raw load(int r) const {
      return {*reinterpret_cast<const uint4*>(first + r * cols), scales[r]};
    }
  };
  __device__ __forceinline__ Cursor at(int64_t row, int64_t col) const {
    return {codes + row * cols + col, scales + col / kColumnBlockSide * scale_block_stride + row, cols};
  }
  __device__ __forceinline__ static void unpack(const Raw& raw, float (&v)[kUnitCols]) {
    const uint32_t words[4] = {raw.codes.x, raw.codes.y, raw.codes.z, raw.codes.w};
    for (int w = 0; w < 4; ++w) {
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
  static constexpr int kUnitCols = E4m3ColumnValues::kUnitCols;
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
      return {*reinterpret_cast<const uint4*>(codes + token * cols), scales[token]};
    }
  };
  __device__ __forceinline__ Cursor at(int64_t row, int64_t col) const {
    return {codes + col, scales + col / kColumnBlockSide * scale_block_stride, routes + row, cols, top_k};
  }
  __device__ __forceinline__ static void unpack(const Raw& raw, float (&v)[kUnitCols]) {
    E4m3ColumnValues::unpack(raw, v);
  }
};

// The CTA of a source: 16 row groups of 8 rows times the block's units.
template <class Source>
inline constexpr int kColumnThreads = (kColumnBlockSide / kSquare) * (kColumnBlockSide / Source::kUnitCols);
// CTAs an SM: 1,024 threads of 64 registers for bf16 units (32 registers of raw values a thread),
// 768 of 80 for e4m3 ones (40: at 64 they spill).
template <class Source>
inline constexpr int kColumnCtasPerSm = (Source::kUnitCols == 8 ? 1024 : 768) / kColumnThreads<Source>;

namespace {  // each unit instantiates its own

constexpr int kSide = kColumnBlockSide;
constexpr int kRowGroups = kSide / kSquare;  // 16
constexpr int kPartialStride = kSide + 4;    // a row group's column maxima, padded off the banks of the next

// `raw` made opaque to the compiler, so that values unpacked from it again are computed again, not
// kept from the first time (128 floats a thread for e4m3 units).
template <class Raw>
__device__ __forceinline__ void hide_from_reuse(Raw& raw) {
  static_assert(sizeof(Raw) % sizeof(uint32_t) == 0, "whole words");
  uint32_t* const words = reinterpret_cast<uint32_t*>(&raw);
  for (int i = 0; i < int(sizeof(Raw) / sizeof(uint32_t)); ++i) asm volatile("" : "+r"(words[i]));
}

// `args`' outputs (its values unused) from `source`'s rows.
template <class Source>
__global__ void __launch_bounds__(kColumnThreads<Source>, kColumnCtasPerSm<Source>)
    quantize_columns_kernel(const QuantizeColumnsArgs args, const Source source) {
  constexpr int kCols = Source::kUnitCols;
  static_assert(kCols % kSquare == 0 && kSide % kCols == 0, "whole 8 x 8 squares a unit, whole units a block");
  static_assert(kColumnThreads<Source> >= kSide && kColumnThreads<Source> % 32 == 0, "a thread per column's scale");
  __shared__ __align__(16) float partial_amax[kRowGroups][kPartialStride];
  __shared__ __align__(16) float column_inverse[kSide];
  // Row blocks first: the CTAs resident at once write each of their columns' codes as one run.
  const int64_t row_blocks = (args.rows + kSide - 1) / kSide;
  const int64_t rb = blockIdx.x % row_blocks, cb = blockIdx.x / row_blocks;
  const int thread = static_cast<int>(threadIdx.x), lane = thread % 32;
  constexpr int kWarpUnits = 8, kUnits = kSide / kCols;  // a warp: 4 row groups x 8 units
  static_assert(kUnits % kWarpUnits == 0, "whole warps across a block's units");
  const int warp = thread / 32;
  const int group = lane / kWarpUnits + 4 * (warp / (kUnits / kWarpUnits)), row0 = kSquare * group;
  const int col0 = kCols * (lane % kWarpUnits + kWarpUnits * (warp % (kUnits / kWarpUnits)));
  const int64_t first_row = rb * kSide + row0, first_col = cb * kSide + col0;
  // cols is a multiple of kCols (a unit's columns lie wholly inside or outside), rows of 4.
  const int rows_here =
      first_col < args.cols ? static_cast<int>(max(int64_t(0), min(int64_t(kSquare), args.rows - first_row))) : 0;

  typename Source::Raw raw[kSquare];  // row r of the unit as loaded; zeros outside the values
  const typename Source::Cursor first = source.at(first_row, first_col);
  for (int r = 0; r < kSquare; ++r) raw[r] = r < rows_here ? first.load(r) : Source::kZero;
  float amax[kCols];
  for (int j = 0; j < kCols; ++j) amax[j] = 0.0f;
  for (int r = 0; r < kSquare; ++r) {
    float v[kCols];  // row r's values
    Source::unpack(raw[r], v);
    for (int j = 0; j < kCols; ++j) amax[j] = fmaxf(amax[j], fabsf(v[j]));
  }
  for (int j = 0; j < kCols; j += 4) {
    *reinterpret_cast<float4*>(&partial_amax[group][col0 + j]) = make_float4(amax[j], amax[j + 1], amax[j + 2], amax[j + 3]);
  }
  __syncthreads();
  if (thread < kSide) {  // column `thread` of the block: its amax, scale and inverse
    float a = 0.0f;
    for (int g = 0; g < kRowGroups; ++g) a = fmaxf(a, partial_amax[g][thread]);
    const BlockScale s = device_block_scale(a, args.rounding);
    column_inverse[thread] = s.inverse;
    const int64_t col = cb * kSide + thread;
    if (col < args.cols) args.scales[col * args.scale_col_stride + rb * args.scale_block_stride] = s.scale;
  }
  __syncthreads();
  if (rows_here == 0) return;
  float inverse[kCols];
  for (int j = 0; j < kCols; j += 4) {
    const float4 f = *reinterpret_cast<const float4*>(&column_inverse[col0 + j]);
    inverse[j] = f.x;
    inverse[j + 1] = f.y;
    inverse[j + 2] = f.z;
    inverse[j + 3] = f.w;
  }

  constexpr int kWords = kCols / 4;  // a row's codes: 4 a word
  uint32_t codes[kSquare][kWords];   // row r's columns 4w .. 4w+3
  for (int r = 0; r < kSquare; ++r) {
    float v[kCols];
    hide_from_reuse(raw[r]);
    Source::unpack(raw[r], v);
    for (int w = 0; w < kWords; ++w) {
      const uint16_t lo = e4m3_code_pair(v[4 * w], v[4 * w + 1], inverse[4 * w], inverse[4 * w + 1]);
      const uint16_t hi = e4m3_code_pair(v[4 * w + 2], v[4 * w + 3], inverse[4 * w + 2], inverse[4 * w + 3]);
      codes[r][w] = uint32_t(lo) | uint32_t(hi) << 16;
    }
  }
  for (int w = 0; w < kWords; ++w) {  // codes[4q + c][w]: column 4w + c's rows 4q .. 4q+3
    for (int q = 0; q < 2; ++q) transpose_4x4(codes[4 * q][w], codes[4 * q + 1][w], codes[4 * q + 2][w], codes[4 * q + 3][w]);
  }
  uint8_t* const out_codes = reinterpret_cast<uint8_t*>(args.codes_t) + first_col * args.codes_row_stride + first_row;
  const bool whole =
      rows_here == kSquare && reinterpret_cast<uintptr_t>(out_codes) % 8 == 0 && args.codes_row_stride % 8 == 0;
  for (int w = 0; w < kWords; ++w) {
    for (int c = 0; c < 4; ++c) {
      uint8_t* const column = out_codes + (4 * w + c) * args.codes_row_stride;
      if (whole) {
        *reinterpret_cast<uint2*>(column) = make_uint2(codes[c][w], codes[4 + c][w]);
      } else {
        *reinterpret_cast<uint32_t*>(column) = codes[c][w];
        if (rows_here == kSquare) *reinterpret_cast<uint32_t*>(column + 4) = codes[4 + c][w];
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
