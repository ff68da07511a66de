// quantize_columns (quantize_fp8.hpp): one CTA a 128 x 128 block of the values, a scale per column.
#include <climits>

#include "caracal/comm/cuda_check.hpp"
#include "caracal/error.hpp"
#include "quant/block_tile.cuh"
#include "quant/operand_checks.hpp"
#include "quant/quantize_fp8.hpp"

namespace caracal::quant {
namespace {

__global__ void __launch_bounds__(kTileThreads) quantize_columns_kernel(const QuantizeColumnsArgs args) {
  __shared__ float partial_amax[kTileRowsPerPass][kTileSide];
  __shared__ float column_inverse[kTileSide];
  __shared__ TransposeTile transposed;
  const int64_t col_blocks = (args.cols + kTileSide - 1) / kTileSide;
  const int64_t rb = blockIdx.x / col_blocks, cb = blockIdx.x % col_blocks;
  const int thread = static_cast<int>(threadIdx.x);
  BlockTile tile;
  tile.rows_here = static_cast<int>(min(int64_t(kTileSide), args.rows - rb * kTileSide));
  tile.cols_here = static_cast<int>(min(int64_t(kTileSide), args.cols - cb * kTileSide));
  tile.load(args.values + rb * kTileSide * args.cols + cb * kTileSide, args.cols);

  for (int j = 0; j < 8; ++j) {
    float amax = 0.0f;
    for (int i = 0; i < kTileRowsPerThread; ++i) amax = fmaxf(amax, fabsf(tile.v[i][j]));
    partial_amax[thread / kTileColumnThreads][BlockTile::col() + j] = amax;
  }
  __syncthreads();
  if (thread < kTileSide) {
    float amax = 0.0f;
    for (const auto& part : partial_amax) amax = fmaxf(amax, part[thread]);
    const BlockScale s = device_block_scale(amax, args.rounding);
    column_inverse[thread] = s.inverse;
    if (thread < tile.cols_here) {
      args.scales[(cb * kTileSide + thread) * args.scale_col_stride + rb * args.scale_block_stride] = s.scale;
    }
  }
  __syncthreads();
  float inverse[8];
  for (int j = 0; j < 8; ++j) inverse[j] = column_inverse[BlockTile::col() + j];
  for (int i = 0; i < kTileRowsPerThread; ++i) {
    transposed.put(BlockTile::row(i), BlockTile::col(), tile.codes(i, inverse));
  }
  __syncthreads();
  transposed.store_transposed(reinterpret_cast<uint8_t*>(args.codes_t) + cb * kTileSide * args.codes_row_stride +
                                  rb * kTileSide,
                              args.codes_row_stride, tile.rows_here, tile.cols_here);
}

}  // namespace

void quantize_columns(const QuantizeColumnsArgs& args, cudaStream_t stream) {
  constexpr const char* kWhere = "quant::quantize_columns";
  CARACAL_CHECK(args.rows >= 0 && args.rows % 4 == 0, kWhere, ": rows must be a non-negative multiple of 4, got ",
                args.rows);
  CARACAL_CHECK(args.cols > 0 && args.cols % 8 == 0, kWhere, ": cols must be a positive multiple of 8, got ",
                args.cols);
  if (args.rows == 0) return;
  check_operands(kWhere, {{args.values, "values", 16}, {args.codes_t, "codes_t", 4}, {args.scales, "scales", 1}});
  CARACAL_CHECK(args.codes_row_stride >= args.rows && args.codes_row_stride % 4 == 0, kWhere,
                ": codes_row_stride must be a multiple of 4 and at least rows (", args.rows, "), got ",
                args.codes_row_stride);
  CARACAL_CHECK(args.scale_col_stride > 0 && args.scale_block_stride > 0, kWhere,
                ": scale_col_stride and scale_block_stride must be positive, got ", args.scale_col_stride, " and ",
                args.scale_block_stride);
  const int64_t blocks = ((args.rows + kTileSide - 1) / kTileSide) * ((args.cols + kTileSide - 1) / kTileSide);
  CARACAL_CHECK(blocks <= INT_MAX, kWhere, ": blocks(rows) * blocks(cols) must be below 2^31, got ", blocks);
  quantize_columns_kernel<<<static_cast<int>(blocks), kTileThreads, 0, stream>>>(args);
  check_cuda(cudaGetLastError(), "quantize_columns_kernel launch");
}

}  // namespace caracal::quant
