#pragma once
// The 8 x 8 squares the block quantizers hold: a CTA of 256 threads covers a 128 x 128 block of
// bf16 values, thread t an 8 x 8 square of it, rows 8a .. 8a+7 and columns 8b .. 8b+7 with (lane l,
// warp w) a = 4 (w / 2) + l % 4 and b = 8 (w % 2) + l / 4. So every global access of a warp covers
// whole 32-byte sectors: a row load reads four 128-byte row segments, a row-major code store
// writes four 64-byte ones, and a transposed code store (a column's 8 codes, from the square
// transposed in registers by byte permutes) eight 32-byte ones. The four lanes of a quad (l / 4
// equal) hold the same columns in 32 consecutive rows; warps w and w + 2, + 4, + 6 the other rows.
#include <cstdint>

namespace caracal::quant {

inline constexpr int kSquareThreads = 256;
inline constexpr int kSquare = 8;  // a thread's rows and columns

// Thread `thread`'s square in its CTA's block: its first row and column.
__device__ __forceinline__ int square_row0(int thread) { return kSquare * (4 * (thread / 32 / 2) + thread % 32 % 4); }
__device__ __forceinline__ int square_col0(int thread) { return kSquare * (8 * (thread / 32 % 2) + thread % 32 / 4); }

// Rows 0-3 of a 4 x 4 square of bytes (a word a row, column c in byte c) into columns 0-3 (a word
// a column, row r in byte r), in place.
__device__ __forceinline__ void transpose_4x4(uint32_t& w0, uint32_t& w1, uint32_t& w2, uint32_t& w3) {
  const uint32_t t0 = __byte_perm(w0, w1, 0x5140), t1 = __byte_perm(w0, w1, 0x7362);
  const uint32_t t2 = __byte_perm(w2, w3, 0x5140), t3 = __byte_perm(w2, w3, 0x7362);
  w0 = __byte_perm(t0, t2, 0x5410);
  w1 = __byte_perm(t0, t2, 0x7632);
  w2 = __byte_perm(t1, t3, 0x5410);
  w3 = __byte_perm(t1, t3, 0x7632);
}

// An 8 x 8 square of codes, codes[r][h] = row r's columns 4h .. 4h+3 (column c in byte c % 4),
// transposed in place: codes[4q + c][h] then holds column 4h + c's rows 4q .. 4q+3.
__device__ __forceinline__ void transpose_square(uint32_t (&codes)[kSquare][2]) {
  for (int h = 0; h < 2; ++h) {
    for (int q = 0; q < 2; ++q) {
      transpose_4x4(codes[4 * q][h], codes[4 * q + 1][h], codes[4 * q + 2][h], codes[4 * q + 3][h]);
    }
  }
}

}  // namespace caracal::quant
