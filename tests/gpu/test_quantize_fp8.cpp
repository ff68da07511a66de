// The FP8 quantizing kernels (src/quant/quantize_fp8.hpp) bit for bit against the host contract
// (caracal/block_fp8.hpp): codes and scales of rows (row-major and MN-major scales), of columns
// (transposed; from bf16 values, and from e4m3 rows taken back to fp32) and of weight blocks in both
// orientations, exact and power-of-two scales, partial
// blocks, all-zero and tiny blocks, NaN values. Outputs are poisoned first, so a value the kernel
// never wrote fails. Fresh random values every run (the seed is in every failure). The argument
// checks need no GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "caracal/bf16.hpp"
#include "caracal/block_fp8.hpp"
#include "error_checks.hpp"
#include "float_bits.hpp"
#include "gpu_test_util.hpp"
#include "quant/quantize_fp8.hpp"

namespace caracal::test {
namespace {

// bf16 values of block-varying magnitude: some blocks tiny (below kMinBlockAmax), one all zero,
// one holding a NaN.
std::vector<uint16_t> random_bf16_bits(std::mt19937_64& rng, int64_t rows, int64_t cols) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<double> log_scale(-16.0, 10.0);
  std::vector<uint16_t> bits(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b * kFp8Block < cols; ++b) {
      const float scale = (r + b) % 11 == 3 ? 0.0f : static_cast<float>(std::exp2(log_scale(rng)));
      for (int64_t c = b * kFp8Block; c < std::min(cols, (b + 1) * kFp8Block); ++c) {
        bits[r * cols + c] = bf16_bits(normal(rng) * scale);
      }
    }
  }
  if (rows > 5 && cols > 7) bits[5 * cols + 7] = 0x7fc0;  // NaN
  return bits;
}

std::vector<float> to_floats(const std::vector<uint16_t>& bits) {
  std::vector<float> values(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) values[i] = bf16_to_float(bits[i]);
  return values;
}

struct RowsCase {
  int64_t rows, cols;
  ScaleRounding rounding;
  bool mn_major_scales;
};

std::string rows_case_name(const ::testing::TestParamInfo<RowsCase>& p) {
  return std::to_string(p.param.rows) + "x" + std::to_string(p.param.cols) +
         (p.param.rounding == ScaleRounding::kExact ? "_exact" : "_pow2") +
         (p.param.mn_major_scales ? "_mn_major" : "_row_major");
}

class QuantizeRowsOnGpu : public ::testing::TestWithParam<RowsCase> {};

TEST_P(QuantizeRowsOnGpu, MatchTheHostContractBitForBit) {
  CARACAL_REQUIRE_GPU();
  const RowsCase c = GetParam();
  const TracedSeed seed;
  std::mt19937_64 rng(seed.value());
  const std::vector<uint16_t> bits = random_bf16_bits(rng, c.rows, c.cols);
  const Fp8Matrix expected = quantize_rows(to_floats(bits), c.rows, c.cols, c.rounding);

  const int64_t blocks = expected.scale_cols();
  const int64_t padded_rows = (c.rows + 3) / 4 * 4;  // MN-major: a TMA row of scales per K block
  DeviceBuffer<uint16_t> values;
  DeviceBuffer<uint8_t> codes;
  DeviceBuffer<float> scales;
  ASSERT_NO_FATAL_FAILURE(values.upload(bits));
  ASSERT_NO_FATAL_FAILURE(codes.allocate(static_cast<size_t>(c.rows * c.cols)));
  ASSERT_NO_FATAL_FAILURE(scales.allocate(static_cast<size_t>(blocks * padded_rows)));
  ASSERT_NO_FATAL_FAILURE(codes.poison());
  ASSERT_NO_FATAL_FAILURE(scales.poison());
  quant::QuantizeRowsArgs args;
  args.values = reinterpret_cast<const __nv_bfloat16*>(values.get());
  args.rows = c.rows;
  args.cols = c.cols;
  args.codes = reinterpret_cast<__nv_fp8_e4m3*>(codes.get());
  args.scales = scales.get();
  args.scale_row_stride = c.mn_major_scales ? 1 : blocks;
  args.scale_block_stride = c.mn_major_scales ? padded_rows : 1;
  args.rounding = c.rounding;
  quant::quantize_rows(args, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  std::vector<uint8_t> got_codes;
  std::vector<float> got_scales;
  ASSERT_NO_FATAL_FAILURE(codes.download(got_codes));
  ASSERT_NO_FATAL_FAILURE(scales.download(got_scales));
  size_t code_mismatches = 0, scale_mismatches = 0;
  for (int64_t r = 0; r < c.rows; ++r) {
    for (int64_t col = 0; col < c.cols; ++col) {
      code_mismatches += got_codes[r * c.cols + col] != expected.codes[r * c.cols + col];
    }
    for (int64_t b = 0; b < blocks; ++b) {
      const float got = got_scales[r * args.scale_row_stride + b * args.scale_block_stride];
      scale_mismatches += float_bits(got) != float_bits(expected.scales[r * blocks + b]);
    }
  }
  EXPECT_EQ(code_mismatches, 0u);
  EXPECT_EQ(scale_mismatches, 0u);
}

INSTANTIATE_TEST_SUITE_P(Shapes, QuantizeRowsOnGpu,
                         ::testing::Values(RowsCase{257, 1000, ScaleRounding::kExact, false},
                                           RowsCase{257, 1000, ScaleRounding::kPowerOfTwo, true},
                                           RowsCase{1, 4, ScaleRounding::kExact, true},
                                           RowsCase{300, 7168, ScaleRounding::kExact, true},
                                           // whole blocks: 3 items (fewer than a warp's), 2,055 (a partial last run)
                                           RowsCase{3, 128, ScaleRounding::kPowerOfTwo, false},
                                           RowsCase{685, 384, ScaleRounding::kExact, false}),
                         rows_case_name);

struct ColumnsCase {
  int64_t rows, cols, codes_row_stride;
  ScaleRounding rounding;
};

std::string columns_case_name(const ::testing::TestParamInfo<ColumnsCase>& p) {
  return std::to_string(p.param.rows) + "x" + std::to_string(p.param.cols) + "_stride" +
         std::to_string(p.param.codes_row_stride) + (p.param.rounding == ScaleRounding::kExact ? "_exact" : "_pow2");
}

// `values` [rows][cols] as [cols][rows].
std::vector<float> transposed(const std::vector<float>& values, int64_t rows, int64_t cols) {
  std::vector<float> t(values.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t col = 0; col < cols; ++col) t[col * rows + r] = values[r * cols + col];
  }
  return t;
}

// A column quantization's outputs in `c`'s layout, poisoned, and the kernels' arguments naming
// them (each test sets the source).
struct ColumnOutputs {
  DeviceBuffer<uint8_t> codes;
  DeviceBuffer<float> scales;
  quant::QuantizeColumnsArgs args;
};

void allocate_column_outputs(const ColumnsCase& c, int64_t blocks, ColumnOutputs& out) {
  ASSERT_NO_FATAL_FAILURE(out.codes.allocate(static_cast<size_t>(c.cols * c.codes_row_stride)));
  ASSERT_NO_FATAL_FAILURE(out.scales.allocate(static_cast<size_t>(c.cols * blocks)));
  ASSERT_NO_FATAL_FAILURE(out.codes.poison());
  ASSERT_NO_FATAL_FAILURE(out.scales.poison());
  out.args.rows = c.rows;
  out.args.cols = c.cols;
  out.args.codes_t = reinterpret_cast<__nv_fp8_e4m3*>(out.codes.get());
  out.args.codes_row_stride = c.codes_row_stride;
  out.args.scales = out.scales.get();
  out.args.scale_col_stride = 1;  // MN-major, as a GEMM's tensor map of the scales reads them
  out.args.scale_block_stride = c.cols;
  out.args.rounding = c.rounding;
}

// How many of the outputs' codes and scales differ from `expected`, the row quantization of the
// transposed values, bit for bit.
void count_column_mismatches(ColumnOutputs& out, const ColumnsCase& c, const Fp8Matrix& expected, size_t& mismatches) {
  std::vector<uint8_t> got_codes;
  std::vector<float> got_scales;
  ASSERT_NO_FATAL_FAILURE(out.codes.download(got_codes));
  ASSERT_NO_FATAL_FAILURE(out.scales.download(got_scales));
  const int64_t blocks = expected.scale_cols();
  mismatches = 0;
  for (int64_t col = 0; col < c.cols; ++col) {
    for (int64_t r = 0; r < c.rows; ++r) {
      mismatches += got_codes[col * c.codes_row_stride + r] != expected.codes[col * c.rows + r];
    }
    for (int64_t b = 0; b < blocks; ++b) {
      mismatches += float_bits(got_scales[col + b * c.cols]) != float_bits(expected.scales[col * blocks + b]);
    }
  }
}

class QuantizeColumnsOnGpu : public ::testing::TestWithParam<ColumnsCase> {};

// The contract of a column quantization: the row quantization of the transposed values.
TEST_P(QuantizeColumnsOnGpu, MatchTheRowQuantizationOfTheTransposeBitForBit) {
  CARACAL_REQUIRE_GPU();
  const ColumnsCase c = GetParam();
  const TracedSeed seed;
  std::mt19937_64 rng(seed.value());
  const std::vector<uint16_t> bits = random_bf16_bits(rng, c.rows, c.cols);
  const std::vector<float> values = to_floats(bits);
  const Fp8Matrix expected = quantize_rows(transposed(values, c.rows, c.cols), c.cols, c.rows, c.rounding);

  DeviceBuffer<uint16_t> d_values;
  ColumnOutputs out;
  ASSERT_NO_FATAL_FAILURE(d_values.upload(bits));
  ASSERT_NO_FATAL_FAILURE(allocate_column_outputs(c, expected.scale_cols(), out));
  out.args.values = reinterpret_cast<const __nv_bfloat16*>(d_values.get());
  quant::quantize_columns(out.args, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  size_t mismatches = 0;
  ASSERT_NO_FATAL_FAILURE(count_column_mismatches(out, c, expected, mismatches));
  EXPECT_EQ(mismatches, 0u);
}

INSTANTIATE_TEST_SUITE_P(Shapes, QuantizeColumnsOnGpu,
                         ::testing::Values(ColumnsCase{260, 200, 260, ScaleRounding::kExact},
                                           ColumnsCase{260, 200, 512, ScaleRounding::kPowerOfTwo},
                                           ColumnsCase{4, 8, 4, ScaleRounding::kExact},
                                           ColumnsCase{1024, 2048, 1024, ScaleRounding::kExact}),
                         columns_case_name);

// quantize_columns_of_e4m3: rows quantized per 1 x 128 block (the host contract), their scales in
// the GEMMs' MN-major layout, quantized again down the columns from their fp32 values
// (dequantize_to_float): the row quantization of the transposed fp32 values, bit for bit.
class QuantizeColumnsOfE4m3OnGpu : public ::testing::TestWithParam<ColumnsCase> {};

TEST_P(QuantizeColumnsOfE4m3OnGpu, MatchTheRowQuantizationOfTheTransposedValuesBitForBit) {
  CARACAL_REQUIRE_GPU();
  const ColumnsCase c = GetParam();
  const TracedSeed seed;
  std::mt19937_64 rng(seed.value());
  const Fp8Matrix rows = quantize_rows(to_floats(random_bf16_bits(rng, c.rows, c.cols)), c.rows, c.cols);
  const std::vector<float> values = dequantize_to_float(rows);
  const Fp8Matrix expected = quantize_rows(transposed(values, c.rows, c.cols), c.cols, c.rows, c.rounding);
  const int64_t row_blocks = rows.scale_cols();
  const int64_t stride = c.rows + 4;  // the row scales' block stride: past the rows, as a buffer's
  std::vector<float> row_scales(static_cast<size_t>(row_blocks * stride), std::nanf(""));
  for (int64_t r = 0; r < c.rows; ++r) {
    for (int64_t b = 0; b < row_blocks; ++b) row_scales[b * stride + r] = rows.scales[r * row_blocks + b];
  }

  DeviceBuffer<uint8_t> d_codes;
  DeviceBuffer<float> d_scales;
  ColumnOutputs out;
  ASSERT_NO_FATAL_FAILURE(d_codes.upload(rows.codes));
  ASSERT_NO_FATAL_FAILURE(d_scales.upload(row_scales));
  ASSERT_NO_FATAL_FAILURE(allocate_column_outputs(c, expected.scale_cols(), out));
  quant::quantize_columns_of_e4m3(out.args,
                                  {reinterpret_cast<const __nv_fp8_e4m3*>(d_codes.get()), d_scales.get(), stride},
                                  nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  size_t mismatches = 0;
  ASSERT_NO_FATAL_FAILURE(count_column_mismatches(out, c, expected, mismatches));
  EXPECT_EQ(mismatches, 0u);
}

// The same rows read in place as tokens' rows (E4m3Rows::routes: a shuffled token per row, k = 3,
// every fifth row a padding route of zeros): the bits of those rows laid out in schedule order (the
// padding rows zero codes under zero scales). One code of one token changed must change them.
TEST_P(QuantizeColumnsOfE4m3OnGpu, TokenRowsThroughRoutesGiveTheRowsBits) {
  CARACAL_REQUIRE_GPU();
  const ColumnsCase c = GetParam();
  const TracedSeed seed;
  std::mt19937_64 rng(seed.value());
  constexpr int kTopK = 3;
  Fp8Matrix rows = quantize_rows(to_floats(random_bf16_bits(rng, c.rows, c.cols)), c.rows, c.cols);
  const int64_t row_blocks = rows.scale_cols();  // the rows' 1 x 128 blocks
  std::vector<int64_t> token_of(static_cast<size_t>(c.rows));
  std::iota(token_of.begin(), token_of.end(), 0);
  std::shuffle(token_of.begin(), token_of.end(), rng);
  std::vector<int2> routes(static_cast<size_t>(c.rows));
  std::vector<uint8_t> token_codes(static_cast<size_t>(c.rows * c.cols), 0);
  std::vector<float> token_scales(static_cast<size_t>(row_blocks * c.rows), 0.0f);
  std::vector<float> row_scales(static_cast<size_t>(row_blocks * c.rows), 0.0f);  // schedule order, MN-major
  for (int64_t r = 0; r < c.rows; ++r) {
    const bool padding = r % 5 == 4;
    routes[r] = padding ? int2{-1, -1} : int2{0, int(token_of[r] * kTopK + r % kTopK)};
    for (int64_t b = 0; b < row_blocks; ++b) {
      if (padding) {
        rows.scales[r * row_blocks + b] = 0.0f;
      } else {
        token_scales[b * c.rows + token_of[r]] = rows.scales[r * row_blocks + b];
      }
      row_scales[b * c.rows + r] = rows.scales[r * row_blocks + b];
    }
    for (int64_t j = 0; j < c.cols; ++j) {
      uint8_t& code = rows.codes[r * c.cols + j];
      if (padding) code = 0;
      if (!padding) token_codes[token_of[r] * c.cols + j] = code;
    }
  }
  DeviceBuffer<uint8_t> d_rows, d_tokens;
  DeviceBuffer<float> d_row_scales, d_token_scales;
  DeviceBuffer<int2> d_routes;
  ASSERT_NO_FATAL_FAILURE(d_rows.upload(rows.codes));
  ASSERT_NO_FATAL_FAILURE(d_row_scales.upload(row_scales));
  ASSERT_NO_FATAL_FAILURE(d_tokens.upload(token_codes));
  ASSERT_NO_FATAL_FAILURE(d_token_scales.upload(token_scales));
  ASSERT_NO_FATAL_FAILURE(d_routes.upload(routes));
  const auto fp8 = [](const DeviceBuffer<uint8_t>& b) { return reinterpret_cast<const __nv_fp8_e4m3*>(b.get()); };
  const int64_t column_blocks = (c.rows + 127) / 128;  // the outputs' scales: a column's 128-row blocks
  const auto run = [&](const quant::E4m3Rows& source, std::vector<uint8_t>& codes, std::vector<float>& scales) {
    ColumnOutputs out;
    ASSERT_NO_FATAL_FAILURE(allocate_column_outputs(c, column_blocks, out));
    quant::quantize_columns_of_e4m3(out.args, source, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_NO_FATAL_FAILURE(out.codes.download(codes));
    ASSERT_NO_FATAL_FAILURE(out.scales.download(scales));
  };
  std::vector<uint8_t> want_codes, got_codes;
  std::vector<float> want_scales, got_scales;
  ASSERT_NO_FATAL_FAILURE(run({fp8(d_rows), d_row_scales.get(), c.rows}, want_codes, want_scales));
  const quant::E4m3Rows gathered{fp8(d_tokens), d_token_scales.get(), c.rows, d_routes.get(), kTopK};
  ASSERT_NO_FATAL_FAILURE(run(gathered, got_codes, got_scales));
  EXPECT_TRUE(want_codes == got_codes) << "codes differ";
  EXPECT_EQ(std::memcmp(want_scales.data(), got_scales.data(), want_scales.size() * sizeof(float)), 0)
      << "scales differ";
  // Column 0's code of the row with the largest scale of the first row block (random bits: the
  // rows' magnitudes differ by many binades, so a change in a small row may round away down the
  // column): the largest code 0x7E makes it the column's largest value, and one that was 0x7E
  // already becomes a small one.
  int64_t big = 0;
  for (int64_t r = 0; r < std::min<int64_t>(c.rows, 128); ++r) {
    if (r % 5 != 4 && token_scales[token_of[r]] > token_scales[token_of[big]]) big = r;
  }
  uint8_t& code = token_codes[static_cast<size_t>(token_of[big] * c.cols)];
  code = (code & 0x7F) == 0x7E ? 0x30 : 0x7E;
  ASSERT_NO_FATAL_FAILURE(d_tokens.upload(token_codes));  // a new buffer
  const quant::E4m3Rows changed{fp8(d_tokens), d_token_scales.get(), c.rows, d_routes.get(), kTopK};
  ASSERT_NO_FATAL_FAILURE(run(changed, got_codes, got_scales));
  EXPECT_FALSE(want_codes == got_codes && std::memcmp(want_scales.data(), got_scales.data(),
                                                      want_scales.size() * sizeof(float)) == 0)
      << "a changed token code went unseen";
}

INSTANTIATE_TEST_SUITE_P(Shapes, QuantizeColumnsOfE4m3OnGpu,
                         ::testing::Values(ColumnsCase{260, 256, 260, ScaleRounding::kExact},
                                           ColumnsCase{260, 384, 516, ScaleRounding::kPowerOfTwo},
                                           ColumnsCase{4, 128, 4, ScaleRounding::kExact},
                                           ColumnsCase{1024, 2048, 1024, ScaleRounding::kExact}),
                         columns_case_name);

struct WeightsCase {
  int64_t experts, n, k;
  ScaleRounding rounding;
};

std::string weights_case_name(const ::testing::TestParamInfo<WeightsCase>& p) {
  return std::to_string(p.param.experts) + "x" + std::to_string(p.param.n) + "x" + std::to_string(p.param.k) +
         (p.param.rounding == ScaleRounding::kExact ? "_exact" : "_pow2");
}

class QuantizeWeightsOnGpu : public ::testing::TestWithParam<WeightsCase> {};

TEST_P(QuantizeWeightsOnGpu, BothOrientationsMatchTheHostContractBitForBit) {
  CARACAL_REQUIRE_GPU();
  const WeightsCase c = GetParam();
  const TracedSeed seed;
  std::mt19937_64 rng(seed.value());
  const std::vector<uint16_t> bits = random_bf16_bits(rng, c.experts * c.n, c.k);
  const int64_t nb = quant::weight_blocks(c.n), kb = quant::weight_blocks(c.k);
  const int64_t scale_row = quant::weight_scale_row(nb), scale_row_t = quant::weight_scale_row(kb);

  DeviceBuffer<uint16_t> weights;
  DeviceBuffer<uint8_t> codes, codes_t;
  DeviceBuffer<float> scales, scales_t;
  ASSERT_NO_FATAL_FAILURE(weights.upload(bits));
  for (DeviceBuffer<uint8_t>* b : {&codes, &codes_t}) {
    ASSERT_NO_FATAL_FAILURE(b->allocate(static_cast<size_t>(c.experts * c.n * c.k)));
    ASSERT_NO_FATAL_FAILURE(b->poison());
  }
  ASSERT_NO_FATAL_FAILURE(scales.allocate(static_cast<size_t>(c.experts * kb * scale_row)));
  ASSERT_NO_FATAL_FAILURE(scales_t.allocate(static_cast<size_t>(c.experts * nb * scale_row_t)));
  ASSERT_NO_FATAL_FAILURE(scales.poison());
  ASSERT_NO_FATAL_FAILURE(scales_t.poison());
  quant::QuantizeWeightsArgs args;
  args.weights = reinterpret_cast<const __nv_bfloat16*>(weights.get());
  args.experts = c.experts;
  args.n = c.n;
  args.k = c.k;
  args.codes = reinterpret_cast<__nv_fp8_e4m3*>(codes.get());
  args.scales = scales.get();
  args.codes_t = reinterpret_cast<__nv_fp8_e4m3*>(codes_t.get());
  args.scales_t = scales_t.get();
  args.rounding = c.rounding;
  quant::quantize_weights(args, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  std::vector<uint8_t> got_codes, got_codes_t;
  std::vector<float> got_scales, got_scales_t;
  ASSERT_NO_FATAL_FAILURE(codes.download(got_codes));
  ASSERT_NO_FATAL_FAILURE(codes_t.download(got_codes_t));
  ASSERT_NO_FATAL_FAILURE(scales.download(got_scales));
  ASSERT_NO_FATAL_FAILURE(scales_t.download(got_scales_t));
  const std::vector<float> all = to_floats(bits);
  size_t mismatches = 0;
  for (int64_t e = 0; e < c.experts; ++e) {
    const std::vector<float> w(all.begin() + e * c.n * c.k, all.begin() + (e + 1) * c.n * c.k);
    const Fp8Matrix expected = quantize_blocks(w, c.n, c.k, c.rounding);
    for (int64_t n = 0; n < c.n; ++n) {
      for (int64_t k = 0; k < c.k; ++k) {
        const uint8_t want = expected.codes[n * c.k + k];
        mismatches += got_codes[(e * c.n + n) * c.k + k] != want;
        mismatches += got_codes_t[(e * c.k + k) * c.n + n] != want;
      }
    }
    for (int64_t bn = 0; bn < nb; ++bn) {
      for (int64_t bk = 0; bk < kb; ++bk) {
        const uint32_t want = float_bits(expected.scales[bn * kb + bk]);
        mismatches += float_bits(got_scales[(e * kb + bk) * scale_row + quant::weight_scale_at(bn)]) != want;
        mismatches += float_bits(got_scales_t[(e * nb + bn) * scale_row_t + quant::weight_scale_at(bk)]) != want;
      }
    }
  }
  EXPECT_EQ(mismatches, 0u);
}

INSTANTIATE_TEST_SUITE_P(Shapes, QuantizeWeightsOnGpu,
                         ::testing::Values(WeightsCase{3, 264, 200, ScaleRounding::kExact},
                                           WeightsCase{2, 264, 200, ScaleRounding::kPowerOfTwo},
                                           WeightsCase{1, 8, 8, ScaleRounding::kExact},
                                           WeightsCase{2, 1536, 2048, ScaleRounding::kExact}),
                         weights_case_name);

// Refused before any CUDA call: these run without a GPU.
TEST(QuantizeFp8Args, RefuseWhatTheKernelsCannotDo) {
  alignas(16) static uint16_t values[64];
  alignas(16) static uint8_t codes[64];
  alignas(16) static float scales[16];
  quant::QuantizeRowsArgs rows;
  rows.values = reinterpret_cast<const __nv_bfloat16*>(values);
  rows.rows = 2;
  rows.cols = 6;
  rows.codes = reinterpret_cast<__nv_fp8_e4m3*>(codes);
  rows.scales = scales;
  rows.scale_row_stride = 1;
  rows.scale_block_stride = 1;
  expect_error([&] { quant::quantize_rows(rows, nullptr); }, {"quantize_rows", "cols", "multiple of 4", "6"});
  rows.cols = 8;
  rows.codes = nullptr;
  expect_error([&] { quant::quantize_rows(rows, nullptr); }, {"quantize_rows", "codes must not be null"});
  rows.codes = reinterpret_cast<__nv_fp8_e4m3*>(codes);
  rows.scale_block_stride = 0;
  expect_error([&] { quant::quantize_rows(rows, nullptr); }, {"scale_block_stride", "positive"});

  quant::QuantizeWeightsArgs w;
  w.weights = reinterpret_cast<const __nv_bfloat16*>(values);
  w.experts = 1;
  w.n = 8;
  w.k = 12;
  w.codes = reinterpret_cast<__nv_fp8_e4m3*>(codes);
  w.scales = scales;
  expect_error([&] { quant::quantize_weights(w, nullptr); }, {"quantize_weights", "k must be", "multiple of 8", "12"});
  w.k = 8;
  w.scales = nullptr;
  expect_error([&] { quant::quantize_weights(w, nullptr); }, {"codes and scales"});
  w.codes = nullptr;
  expect_error([&] { quant::quantize_weights(w, nullptr); }, {"at least one of codes and codes_t"});
  w.codes = reinterpret_cast<__nv_fp8_e4m3*>(codes);
  w.scales = scales;
  w.weights = reinterpret_cast<const __nv_bfloat16*>(reinterpret_cast<const char*>(values) + 2);
  expect_error([&] { quant::quantize_weights(w, nullptr); }, {"weights must be 16-byte aligned"});
  w.weights = reinterpret_cast<const __nv_bfloat16*>(values);
  w.codes = reinterpret_cast<__nv_fp8_e4m3*>(reinterpret_cast<char*>(codes) + 4);
  expect_error([&] { quant::quantize_weights(w, nullptr); }, {"codes must be 8-byte aligned"});
  w.codes = reinterpret_cast<__nv_fp8_e4m3*>(codes);
  w.codes_t = reinterpret_cast<__nv_fp8_e4m3*>(reinterpret_cast<char*>(codes) + 4);
  w.scales_t = scales;
  expect_error([&] { quant::quantize_weights(w, nullptr); }, {"codes_t must be 8-byte aligned"});

  quant::QuantizeColumnsArgs cols;
  cols.values = reinterpret_cast<const __nv_bfloat16*>(values);
  cols.rows = 4;
  cols.cols = 8;
  cols.codes_t = reinterpret_cast<__nv_fp8_e4m3*>(codes);
  cols.codes_row_stride = 2;
  cols.scales = scales;
  cols.scale_col_stride = 1;
  cols.scale_block_stride = 8;
  expect_error([&] { quant::quantize_columns(cols, nullptr); },
               {"quantize_columns", "codes_row_stride", "at least rows"});
  cols.codes_row_stride = 4;
  cols.rows = 6;
  expect_error([&] { quant::quantize_columns(cols, nullptr); }, {"quantize_columns", "rows", "multiple of 4", "6"});
  cols.rows = 4;
  cols.scales = reinterpret_cast<float*>(reinterpret_cast<char*>(scales) + 2);
  expect_error([&] { quant::quantize_columns(cols, nullptr); }, {"quantize_columns", "scales", "4-byte"});

  cols.scales = scales;
  const quant::E4m3Rows e4m3{reinterpret_cast<const __nv_fp8_e4m3*>(codes), scales, 4};
  expect_error([&] { quant::quantize_columns_of_e4m3(cols, e4m3, nullptr); },
               {"quantize_columns_of_e4m3", "args.values must be null"});
  cols.values = nullptr;
  expect_error([&] { quant::quantize_columns_of_e4m3(cols, e4m3, nullptr); },
               {"quantize_columns_of_e4m3", "cols must be a positive multiple of 128", "8"});
  cols.cols = 128;
  expect_error([&] { quant::quantize_columns_of_e4m3(cols, {e4m3.codes, scales, 2}, nullptr); },
               {"quantize_columns_of_e4m3", "rows.scale_block_stride", "at least rows"});
  const int2* const routes = reinterpret_cast<const int2*>(codes);
  expect_error([&] { quant::quantize_columns_of_e4m3(cols, {e4m3.codes, scales, 4, routes, 0}, nullptr); },
               {"quantize_columns_of_e4m3", "rows.top_k must be >= 1 with rows.routes", "got 0"});
  expect_error([&] { quant::quantize_columns_of_e4m3(cols, {e4m3.codes, scales, 0, routes, 2}, nullptr); },
               {"quantize_columns_of_e4m3", "rows.scale_block_stride must be >= 1", "got 0"});
  const auto* const codes_off_16 = reinterpret_cast<const __nv_fp8_e4m3*>(codes + 8);  // a thread loads 16 codes
  expect_error([&] { quant::quantize_columns_of_e4m3(cols, {codes_off_16, scales, 4}, nullptr); },
               {"quantize_columns_of_e4m3", "rows.codes must be 16-byte aligned"});
}

}  // namespace
}  // namespace caracal::test
