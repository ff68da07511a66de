#pragma once
// The FP8 recipe's quantization, on the host: the contract the quantizing kernels and epilogues
// meet bit for bit, and what the fp64 reference applies to its inputs to measure the FP8 kernels.
//
// DeepSeek-V3's block scaling (as DeepGEMM's casts run it): values become e4m3 codes in blocks of
// 1 x 128 along a row (activations and gradients, along the GEMM's K) or 128 x 128 (weights), one
// fp32 dequantization scale per block. For a block with largest magnitude amax (fmax over it: a
// NaN value does not count):
//   a = max(amax, kMinBlockAmax)                 no block divides by zero
//   exact scales:          s = a / 448,  inverse = 448 / a
//   power-of-two scales:   s = 2^ceil(log2(a / 448)),  inverse = 1 / s    (UE8M0-representable)
//   code(x) = e4m3(x * inverse)                  saturating to +-448; NaN stays NaN
//   value(code) = float(code) * s
// each step one fp32 operation rounded to nearest even, so a kernel doing the same operations in
// the same order lands on the same bits. A block's last columns (or rows) may be partial.
#include <cstdint>
#include <vector>

namespace caracal {

inline constexpr int64_t kFp8Block = 128;        // values per scale along a row; rows and cols per weight block
inline constexpr float kE4m3Max = 448.0f;        // the largest finite e4m3 value
inline constexpr float kMinBlockAmax = 1e-4f;    // a block's amax is taken at least this

enum class ScaleRounding { kExact, kPowerOfTwo };

// e4m3 (1 sign, 4 exponent, 3 mantissa bits, bias 7, no infinities, NaN 0x7f / 0xff): the code
// nearest `value`, ties to even, finite values beyond 448 saturated; and the value of a code.
uint8_t e4m3_bits(float value);
float e4m3_to_float(uint8_t code);

struct BlockScale {
  float scale = 1.0f;    // s: value = code * s
  float inverse = 1.0f;  // what values are multiplied by before they are rounded to e4m3
};
BlockScale block_scale(float amax, ScaleRounding rounding);

// A [rows][cols] matrix quantized in blocks of block_rows x 128: codes [rows][cols], scales
// [ceil(rows / block_rows)][ceil(cols / 128)].
struct Fp8Matrix {
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t block_rows = 1;  // 1: per 1 x 128 block along each row; kFp8Block: per 128 x 128 block
  std::vector<uint8_t> codes;
  std::vector<float> scales;

  int64_t scale_cols() const { return (cols + kFp8Block - 1) / kFp8Block; }
  float scale(int64_t row, int64_t col) const {
    return scales[(row / block_rows) * scale_cols() + col / kFp8Block];
  }
  // The value the GEMMs see: code * scale.
  double value(int64_t row, int64_t col) const;
};

// Per 1 x 128 block along each row (activations, gradients), and per 128 x 128 block (weights).
Fp8Matrix quantize_rows(const std::vector<float>& values, int64_t rows, int64_t cols,
                        ScaleRounding rounding = ScaleRounding::kExact);
Fp8Matrix quantize_blocks(const std::vector<float>& values, int64_t rows, int64_t cols,
                          ScaleRounding rounding = ScaleRounding::kExact);

// Every value, [rows][cols] row-major.
std::vector<double> dequantize(const Fp8Matrix& q);
// Every value as the quantizing kernels take an e4m3 matrix back to fp32 (to quantize it again, down
// the columns: quant::quantize_columns_of_e4m3): float(code) * scale, one fp32 multiplication.
std::vector<float> dequantize_to_float(const Fp8Matrix& q);

}  // namespace caracal
