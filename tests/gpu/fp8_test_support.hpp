#pragma once
// What the FP8 GEMM tests share: operands quantized on the host by the recipe's contract
// (caracal/block_fp8.hpp) in the kernels' layouts, with their dequantized values for the fp64
// references, and their device copies.
#include <cstddef>
#include <cstdint>
#include <vector>

#include <cuda_fp8.h>
#include <gtest/gtest.h>

#include "caracal/bf16.hpp"
#include "caracal/block_fp8.hpp"
#include "caracal/gemm/grouped_gemm_fp8.hpp"
#include "gpu_test_util.hpp"
#include "output_checks.hpp"

namespace caracal::test::gemm {

// The FP8 GEMMs' bounds against the fp64 GEMMs of the dequantized operands (test_grouped_gemm_fp8,
// test_grouped_gemm_fp8_backward, and test_expert_pass_fp8 through the pass): what is left is the
// tensor cores' accumulation within a 128-wide K block (FP8 wgmma keeps fewer bits than fp32: ~14,
// the reason for promoting every block), the fp32 promotion across blocks, and the outputs' bf16
// rounding. ~2-3x the largest errors measured (docs/PERF.md, "Tight checks"); an expert 0.5% off
// still fails (the tests' CatchDeliberateErrors).
constexpr ErrorBound kFp8GateUpBound{2e-3, 2.8e-3};
constexpr ErrorBound kFp8HiddenBound{3.3e-3, 4e-3};
constexpr ErrorBound kFp8DownBound{2.6e-3, 3.2e-3};
constexpr ErrorBound kFp8DgradBound{2e-3, 4e-3};  // d_gate, d_up
constexpr ErrorBound kFp8DxBound{2e-3, 2.4e-3};

// Each expert's [rows][cols] matrix of `w` transposed to [cols][rows] (the weights' second
// orientation).
inline std::vector<float> transposed(const std::vector<float>& w, size_t experts, size_t rows, size_t cols) {
  std::vector<float> t(w.size());
  for (size_t e = 0; e < experts; ++e) {
    for (size_t r = 0; r < rows; ++r) {
      for (size_t c = 0; c < cols; ++c) t[(e * cols + c) * rows + r] = w[(e * rows + r) * cols + c];
    }
  }
  return t;
}

inline std::vector<float> floats_of(const std::vector<uint16_t>& bits) {
  std::vector<float> v(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) v[i] = caracal::bf16_to_float(bits[i]);
  return v;
}

// Rows quantized per 1 x 128 block, in the kernels' layout: codes [rows][K], scales [K/128][rows].
struct QuantizedRows {
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  std::vector<double> values;  // dequantized, [rows][K]
};

inline QuantizedRows quantize_rows_for_gemm(const std::vector<float>& rows_values, size_t rows, size_t k) {
  const caracal::Fp8Matrix q = caracal::quantize_rows(rows_values, int64_t(rows), int64_t(k));
  QuantizedRows out;
  out.codes = q.codes;
  out.values = caracal::dequantize(q);
  const size_t blocks = size_t(q.scale_cols());
  out.scales.resize(blocks * rows);
  for (size_t r = 0; r < rows; ++r) {
    for (size_t b = 0; b < blocks; ++b) out.scales[b * rows + r] = q.scales[r * blocks + b];
  }
  return out;
}

// Expert weights [L][N][K] quantized per 128 x 128 block: codes [L][N][K], scales
// [L][K/128][fp8_weight_scale_row(N/128)], block nb at fp8_weight_scale_at(nb) (0 between).
struct QuantizedWeights {
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  std::vector<double> values;  // dequantized, [L][N][K]
};

inline QuantizedWeights quantize_weights_for_gemm(const std::vector<float>& w, size_t experts, size_t n, size_t k) {
  const size_t nb = (n + 127) / 128, kb = (k + 127) / 128;
  const size_t row = size_t(caracal::gemm::fp8_weight_scale_row(int64_t(nb)));
  QuantizedWeights out;
  out.scales.assign(experts * kb * row, 0.0f);
  for (size_t e = 0; e < experts; ++e) {
    const std::vector<float> one(w.begin() + int64_t(e * n * k), w.begin() + int64_t((e + 1) * n * k));
    const caracal::Fp8Matrix q = caracal::quantize_blocks(one, int64_t(n), int64_t(k));
    out.codes.insert(out.codes.end(), q.codes.begin(), q.codes.end());
    const std::vector<double> v = caracal::dequantize(q);
    out.values.insert(out.values.end(), v.begin(), v.end());
    for (size_t bn = 0; bn < nb; ++bn) {
      for (size_t bk = 0; bk < kb; ++bk) out.scales[(e * kb + bk) * row + size_t(caracal::gemm::fp8_weight_scale_at(int64_t(bn)))] = q.scales[bn * kb + bk];
    }
  }
  return out;
}

struct DeviceQuantized {
  DeviceBuffer<uint8_t> codes;
  DeviceBuffer<float> scales;
  void upload(const std::vector<uint8_t>& c, const std::vector<float>& s) {
    ASSERT_NO_FATAL_FAILURE(codes.upload(c));
    ASSERT_NO_FATAL_FAILURE(scales.upload(s));
  }
  const __nv_fp8_e4m3* fp8() const { return reinterpret_cast<const __nv_fp8_e4m3*>(codes.get()); }
};

}  // namespace caracal::test::gemm
