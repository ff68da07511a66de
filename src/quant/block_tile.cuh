#pragma once
// One CTA's 128 x 128 block of bf16 values, as the block quantizers hold it: thread t of 256 holds
// rows t/16 + 16i (i < 8) and columns 8(t%16) .. +8, loaded as 16-byte vectors; its codes are
// written in place and, through a shared-memory tile, transposed.
#include <cuda_bf16.h>

#include <cstdint>

#include "caracal/block_fp8.hpp"
#include "quant/block_scale.cuh"

namespace caracal::quant {

inline constexpr int kTileThreads = 256;
inline constexpr int kTileSide = static_cast<int>(kFp8Block);
inline constexpr int kTileColumnThreads = kTileSide / 8;               // 16: 8 columns each
inline constexpr int kTileRowsPerPass = kTileThreads / kTileColumnThreads;  // 16
inline constexpr int kTileRowsPerThread = kTileSide / kTileRowsPerPass;     // 8

struct BlockTile {
  float v[kTileRowsPerThread][8];
  int rows_here;  // the block's rows and columns inside the matrix (partial at its edges;
  int cols_here;  // cols_here a multiple of 8, rows_here of 4)

  __device__ static int row(int i) { return static_cast<int>(threadIdx.x) / kTileColumnThreads + i * kTileRowsPerPass; }
  __device__ static int col() { return static_cast<int>(threadIdx.x) % kTileColumnThreads * 8; }

  // The block at `block` (its first value) of a matrix with `row_stride` values a row; values
  // outside it read as 0.
  __device__ void load(const __nv_bfloat16* block, int64_t row_stride) {
    for (int i = 0; i < kTileRowsPerThread; ++i) {
      uint4 packed = make_uint4(0, 0, 0, 0);
      if (row(i) < rows_here && col() < cols_here) {
        packed = *reinterpret_cast<const uint4*>(block + row(i) * row_stride + col());
      }
      const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&packed);
      for (int j = 0; j < 4; ++j) {
        const float2 f = __bfloat1622float2(pairs[j]);
        v[i][2 * j] = f.x, v[i][2 * j + 1] = f.y;
      }
    }
  }

  __device__ float thread_amax() const {
    float amax = 0.0f;
    for (const auto& row_values : v) {
      for (float x : row_values) amax = fmaxf(amax, fabsf(x));
    }
    return amax;
  }

  // The codes of row(i) (columns col() .. +8), each value times `inverse[j]`.
  __device__ uint2 codes(int i, const float (&inverse)[8]) const {
    uint2 packed = make_uint2(0, 0);
    for (int j = 0; j < 8; ++j) {
      (j < 4 ? packed.x : packed.y) |= uint32_t(e4m3_code(v[i][j], inverse[j])) << (8 * (j % 4));
    }
    return packed;
  }
};

// A block's codes in shared memory, for the transposed store.
struct TransposeTile {
  static constexpr int kPitch = kTileSide + 8;  // bytes a row: 8-byte aligned rows
  alignas(16) uint8_t codes[kTileSide][kPitch];

  __device__ void put(int row, int col, uint2 packed) { *reinterpret_cast<uint2*>(&codes[row][col]) = packed; }

  // After a barrier: column c of the block becomes row c of `out` (`out_row_stride` codes a row),
  // half a row a thread, four codes a store.
  __device__ void store_transposed(uint8_t* out, int64_t out_row_stride, int rows_here, int cols_here) const {
    const int thread = static_cast<int>(threadIdx.x);
    const int column = thread / 2;
    if (column >= cols_here) return;
    const int first = thread % 2 * (kTileSide / 2);
    for (int r = first; r < first + kTileSide / 2 && r < rows_here; r += 4) {
      uint32_t packed = 0;
      for (int j = 0; j < 4; ++j) packed |= uint32_t(codes[r + j][column]) << (8 * j);
      *reinterpret_cast<uint32_t*>(out + column * out_row_stride + r) = packed;
    }
  }
};

}  // namespace caracal::quant
