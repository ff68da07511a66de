#include "caracal/block_fp8.hpp"

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>

#include "caracal/error.hpp"

namespace caracal {

uint8_t e4m3_bits(float value) { return __nv_cvt_float_to_fp8(value, __NV_SATFINITE, __NV_E4M3); }

float e4m3_to_float(uint8_t code) { return __half2float(__half(__nv_cvt_fp8_to_halfraw(code, __NV_E4M3))); }

BlockScale block_scale(float amax, ScaleRounding rounding) {
  const float a = std::max(amax, kMinBlockAmax);
  if (rounding == ScaleRounding::kExact) return {a / kE4m3Max, kE4m3Max / a};
  // The smallest power of two at or above a / 448.
  int exponent = 0;
  const float mantissa = std::frexp(a / kE4m3Max, &exponent);  // in [0.5, 1)
  const float scale = std::ldexp(1.0f, mantissa == 0.5f ? exponent - 1 : exponent);
  return {scale, 1.0f / scale};
}

namespace {

void check_shape(const std::vector<float>& values, int64_t rows, int64_t cols, const char* what) {
  CARACAL_CHECK(rows >= 0 && cols >= 0, what, ": rows and cols must be non-negative, got ", rows, " x ", cols);
  CARACAL_CHECK(static_cast<int64_t>(values.size()) == rows * cols, what, ": values must hold rows * cols = ",
                rows * cols, " values, got ", values.size());
}

// fmax over [begin, end) of rows [row_begin, row_end): NaN values do not count.
float block_amax(const std::vector<float>& values, int64_t cols, int64_t row_begin, int64_t row_end, int64_t begin,
                 int64_t end) {
  float amax = 0.0f;
  for (int64_t r = row_begin; r < row_end; ++r) {
    for (int64_t c = begin; c < end; ++c) amax = std::fmax(amax, std::fabs(values[r * cols + c]));
  }
  return amax;
}

// `values` quantized in blocks of block_rows x kFp8Block.
Fp8Matrix quantize(const std::vector<float>& values, int64_t rows, int64_t cols, int64_t block_rows,
                   ScaleRounding rounding, const char* what) {
  check_shape(values, rows, cols, what);
  Fp8Matrix q;
  q.rows = rows;
  q.cols = cols;
  q.block_rows = block_rows;
  q.codes.resize(values.size());
  const int64_t scale_rows = (rows + block_rows - 1) / block_rows;
  q.scales.resize(static_cast<size_t>(scale_rows * q.scale_cols()));
  for (int64_t br = 0; br < scale_rows; ++br) {
    const int64_t row_begin = br * block_rows, row_end = std::min(rows, row_begin + block_rows);
    for (int64_t bc = 0; bc < q.scale_cols(); ++bc) {
      const int64_t begin = bc * kFp8Block, end = std::min(cols, begin + kFp8Block);
      const BlockScale s = block_scale(block_amax(values, cols, row_begin, row_end, begin, end), rounding);
      q.scales[br * q.scale_cols() + bc] = s.scale;
      for (int64_t r = row_begin; r < row_end; ++r) {
        for (int64_t c = begin; c < end; ++c) q.codes[r * cols + c] = e4m3_bits(values[r * cols + c] * s.inverse);
      }
    }
  }
  return q;
}

}  // namespace

double Fp8Matrix::value(int64_t row, int64_t col) const {
  return static_cast<double>(e4m3_to_float(codes[row * cols + col])) * static_cast<double>(scale(row, col));
}

Fp8Matrix quantize_rows(const std::vector<float>& values, int64_t rows, int64_t cols, ScaleRounding rounding) {
  return quantize(values, rows, cols, 1, rounding, "quantize_rows");
}

Fp8Matrix quantize_blocks(const std::vector<float>& values, int64_t rows, int64_t cols, ScaleRounding rounding) {
  return quantize(values, rows, cols, kFp8Block, rounding, "quantize_blocks");
}

std::vector<double> dequantize(const Fp8Matrix& q) {
  std::vector<double> out(q.codes.size());
  for (int64_t r = 0; r < q.rows; ++r) {
    for (int64_t c = 0; c < q.cols; ++c) out[r * q.cols + c] = q.value(r, c);
  }
  return out;
}

std::vector<float> dequantize_to_float(const Fp8Matrix& q) {
  std::vector<float> out(q.codes.size());
  for (int64_t r = 0; r < q.rows; ++r) {
    for (int64_t c = 0; c < q.cols; ++c) {
      const size_t i = static_cast<size_t>(r * q.cols + c);
      out[i] = e4m3_to_float(q.codes[i]) * q.scale(r, c);
    }
  }
  return out;
}

}  // namespace caracal
