// quantize_columns (quantize_fp8.hpp): one CTA a 128 x 128 block of the values, a scale per column,
// a thread an 8 x 8 square of it (square_tile.cuh). A column's amax over the block's rows: its 8
// rows in each square, the quad's 32 rows by shuffles, the four quarters of the rows (warps w / 2)
// through shared memory. The codes leave transposed from byte permutes in registers, 8 bytes a
// column where the layout keeps them 8-byte aligned, else two 4-byte stores.
#include <climits>

#include "caracal/comm/cuda_check.hpp"
#include "caracal/error.hpp"
#include "quant/block_scale.cuh"
#include "quant/operand_checks.hpp"
#include "quant/quantize_fp8.hpp"
#include "quant/square_tile.cuh"

namespace caracal::quant {
namespace {

constexpr int kSide = static_cast<int>(kFp8Block);
constexpr int kQuarters = kSide / (4 * kSquare);  // row quarters of a block: 4 (a quad's 32 rows each)

__global__ void __launch_bounds__(kSquareThreads) quantize_columns_kernel(const QuantizeColumnsArgs args) {
  __shared__ float quarter_amax[kQuarters][kSide];
  const int64_t col_blocks = (args.cols + kSide - 1) / kSide;
  const int64_t rb = blockIdx.x / col_blocks, cb = blockIdx.x % col_blocks;
  const int thread = static_cast<int>(threadIdx.x), lane = thread % 32;
  const int row0 = square_row0(thread), col0 = square_col0(thread);
  const int64_t first_row = rb * kSide + row0, first_col = cb * kSide + col0;
  // cols is a multiple of 8 (a square's columns lie wholly inside or outside), rows of 4.
  const int rows_here =
      first_col < args.cols ? static_cast<int>(max(int64_t(0), min(int64_t(kSquare), args.rows - first_row))) : 0;

  float v[kSquare][kSquare];  // row r, column j of the square; 0 outside the values
  const __nv_bfloat16* const first = args.values + first_row * args.cols + first_col;
  for (int r = 0; r < kSquare; ++r) {
    uint4 raw = make_uint4(0, 0, 0, 0);
    if (r < rows_here) raw = *reinterpret_cast<const uint4*>(first + r * args.cols);
    const uint32_t pairs[4] = {raw.x, raw.y, raw.z, raw.w};
    for (int j = 0; j < 4; ++j) {
      const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&pairs[j]));
      v[r][2 * j] = f.x;
      v[r][2 * j + 1] = f.y;
    }
  }
  float amax[kSquare];
  for (int j = 0; j < kSquare; ++j) {
    amax[j] = 0.0f;
    for (int r = 0; r < kSquare; ++r) amax[j] = fmaxf(amax[j], fabsf(v[r][j]));
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
    uint16_t p[4];
    for (int j = 0; j < 4; ++j) p[j] = e4m3_code_pair(v[r][2 * j], v[r][2 * j + 1], inverse[2 * j], inverse[2 * j + 1]);
    codes[r][0] = uint32_t(p[0]) | uint32_t(p[1]) << 16;
    codes[r][1] = uint32_t(p[2]) | uint32_t(p[3]) << 16;
  }
  transpose_square(codes);  // codes[4q + c][h]: column 4h + c's rows 4q .. 4q+3
  uint8_t* const out = reinterpret_cast<uint8_t*>(args.codes_t) + first_col * args.codes_row_stride + first_row;
  const bool whole = rows_here == kSquare && reinterpret_cast<uintptr_t>(out) % 8 == 0 && args.codes_row_stride % 8 == 0;
  for (int h = 0; h < 2; ++h) {
    for (int c = 0; c < 4; ++c) {
      uint8_t* const column = out + (4 * h + c) * args.codes_row_stride;
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

void quantize_columns(const QuantizeColumnsArgs& args, cudaStream_t stream) {
  constexpr const char* kWhere = "quant::quantize_columns";
  CARACAL_CHECK(args.rows >= 0 && args.rows % 4 == 0, kWhere, ": rows must be a non-negative multiple of 4, got ",
                args.rows);
  CARACAL_CHECK(args.cols > 0 && args.cols % 8 == 0, kWhere, ": cols must be a positive multiple of 8, got ",
                args.cols);
  if (args.rows == 0) return;
  check_operands(kWhere, {{args.values, "values", 16}, {args.codes_t, "codes_t", 4}, {args.scales, "scales", 4}});
  CARACAL_CHECK(args.codes_row_stride >= args.rows && args.codes_row_stride % 4 == 0, kWhere,
                ": codes_row_stride must be a multiple of 4 and at least rows (", args.rows, "), got ",
                args.codes_row_stride);
  CARACAL_CHECK(args.scale_col_stride > 0 && args.scale_block_stride > 0, kWhere,
                ": scale_col_stride and scale_block_stride must be positive, got ", args.scale_col_stride, " and ",
                args.scale_block_stride);
  const int64_t blocks = ((args.rows + kSide - 1) / kSide) * ((args.cols + kSide - 1) / kSide);
  CARACAL_CHECK(blocks <= INT_MAX, kWhere, ": blocks(rows) * blocks(cols) must be below 2^31, got ", blocks);
  quantize_columns_kernel<<<static_cast<int>(blocks), kSquareThreads, 0, stream>>>(args);
  check_cuda(cudaGetLastError(), "quantize_columns_kernel launch");
}

}  // namespace caracal::quant
