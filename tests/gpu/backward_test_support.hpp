#pragma once
// What the backward GEMM tests share (bf16 and FP8): the row gates, and the checks of the router
// score gradient and of the rows whose g is 0 or 1.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "float_bits.hpp"
#include "grouped_gemm_test_support.hpp"

namespace caracal::test::gemm {

using caracal::float_bits;

inline constexpr uint32_t kPoisonF32 = 0xFFFFFFFFu;  // what poison() leaves in an fp32 buffer: a NaN

// g of the i-th real row of an expert: 0 on every 5th row (from the 3rd), 1 on every 7th (from
// the 4th) that is not 0, otherwise uniform in [0.05, 1].
inline float row_gate(int i, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> dist(0.05f, 1.0f);
  float const g = dist(rng);
  if (i % 5 == 2) return 0.0f;
  if (i % 7 == 3) return 1.0f;
  return g;
}

// [capacity] gates: row_gate on each expert's real rows, 0 elsewhere.
inline std::vector<float> row_gates(const ExpertInputs& in, std::mt19937_64& rng) {
  std::vector<float> gates(size_t(in.rows.capacity), 0.0f);
  for (size_t e = 0; e < size_t(in.num_experts); ++e) {
    const size_t begin = size_t(in.rows.offset[e]);
    for (size_t i = 0; i < size_t(in.c.counts[e]); ++i) gates[begin + i] = row_gate(int(i), rng);
  }
  return gates;
}

// dL/dg per real row: |dg - ref| <= relative |ref| + of_scale * scale, scale being the size of the
// row's terms (sqrt(sum_j (d_h_j hidden_j)^2): a dot product of I terms may cancel to far below
// them), and a relative Frobenius error of at most `frobenius` over all rows.
struct RouterGradBound {
  double relative, of_scale, frobenius;
};

// dg ([capacity]) against `ref` and `ref_scale`; padding rows hold 0, rows past expert_offset[L]
// keep the poison.
inline void expect_router_grad(const ExpertInputs& in, const std::vector<float>& gates, const std::vector<double>& ref,
                               const std::vector<double>& ref_scale, const std::vector<float>& dg,
                               const RouterGradBound& bound) {
  size_t bad = 0, nan_count = 0, padding_nonzero = 0, touched = 0, first_bad = 0;
  double err2 = 0.0, ref2 = 0.0, worst_of_scale = 0.0;  // the largest |dg - ref| / scale: of_scale's measure
  for (size_t e = 0; e < size_t(in.num_experts); ++e) {
    const size_t begin = size_t(in.rows.offset[e]), real_end = begin + size_t(in.c.counts[e]);
    for (size_t row = begin; row < size_t(in.rows.offset[e + 1]); ++row) {
      const double v = double(dg[row]);
      if (row >= real_end) {
        padding_nonzero += v != 0.0;
        continue;
      }
      if (std::isnan(v)) {
        ++nan_count;
        continue;
      }
      const double err = std::abs(v - ref[row]);
      if (ref_scale[row] > 0.0) worst_of_scale = std::max(worst_of_scale, err / ref_scale[row]);
      if (err > bound.relative * std::abs(ref[row]) + bound.of_scale * ref_scale[row] && bad++ == 0) first_bad = row;
      err2 += err * err;
      ref2 += ref[row] * ref[row];
    }
  }
  for (size_t row = size_t(in.rows.offset.back()); row < size_t(in.rows.capacity); ++row) {
    touched += float_bits(dg[row]) != kPoisonF32;
  }
  EXPECT_EQ(nan_count, 0u) << "dg still holds NaN";
  EXPECT_EQ(bad, 0u) << "dg out of tolerance on " << bad << " rows, e.g. row " << first_bad << ": " << dg[first_bad]
                     << " vs " << ref[first_bad] << " (g " << gates[first_bad] << ")";
  EXPECT_EQ(padding_nonzero, 0u) << "dg: padding rows must hold 0";
  EXPECT_EQ(touched, 0u) << "dg: rows past expert_offset[L] must be left untouched";
  if (ref2 == 0.0) return;
  const double rel = std::sqrt(err2 / ref2);
  EXPECT_LE(rel, bound.frobenius) << "dg: relative Frobenius error " << rel;
  std::cout << "  dg: relative Frobenius error " << rel << ", worst error in units of its row's scale "
            << worst_of_scale << "\n";
}

// Rows with g = 0 get exact zeros in d_gate_up and scaled_activation (their dg is checked apart);
// rows with g = 1 get scaled_activation equal to the forward's hidden, bit for bit: the backward
// recomputes hidden exactly as the forward did.
inline void expect_gate_edge_rows(const ExpertInputs& in, const std::vector<float>& gates,
                                  const std::vector<uint16_t>& hidden, const std::vector<uint16_t>& d_gate_up,
                                  const std::vector<uint16_t>& scaled_activation) {
  const size_t I = size_t(in.c.intermediate);
  size_t zero_rows = 0, one_rows = 0, nonzero = 0, hidden_mismatch = 0;
  for (size_t e = 0; e < size_t(in.num_experts); ++e) {
    const size_t begin = size_t(in.rows.offset[e]);
    for (size_t row = begin; row < begin + size_t(in.c.counts[e]); ++row) {
      if (gates[row] == 0.0f) {
        ++zero_rows;
        for (size_t j = 0; j < 2 * I; ++j) nonzero += (d_gate_up[row * 2 * I + j] & 0x7FFF) != 0;
        for (size_t j = 0; j < I; ++j) nonzero += (scaled_activation[row * I + j] & 0x7FFF) != 0;
      } else if (gates[row] == 1.0f) {
        ++one_rows;
        for (size_t j = 0; j < I; ++j) hidden_mismatch += scaled_activation[row * I + j] != hidden[row * I + j];
      }
    }
  }
  EXPECT_EQ(nonzero, 0u) << "rows with g = 0 must get zero d_gate_up and scaled_activation";
  EXPECT_EQ(hidden_mismatch, 0u) << "rows with g = 1: scaled_activation differs from the forward's hidden";
  std::cout << "  rows with g = 0: " << zero_rows << ", with g = 1: " << one_rows << "\n";
}

}  // namespace caracal::test::gemm
