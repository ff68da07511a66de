// The FP8 recipe's host quantization (caracal/block_fp8.hpp): e4m3 rounding against a decoder and a
// nearest-code search written here, the block scales' rule, and the blocks' error bound. Random
// inputs are seeded from std::random_device (CARACAL_TEST_SEED=<seed> reproduces; the seed is in
// every failure).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "caracal/block_fp8.hpp"
#include "caracal/error.hpp"
#include "error_checks.hpp"
#include "fresh_seed.hpp"

namespace caracal {
namespace {

bool is_nan_code(uint8_t code) { return (code & 0x7f) == 0x7f; }

// e4m3 decoded from its fields: bias 7, subnormals 2^-6 * m/8, no infinities.
double decode(uint8_t code) {
  const int sign = code >> 7, exponent = (code >> 3) & 0xf, mantissa = code & 0x7;
  const double magnitude =
      exponent == 0 ? std::ldexp(mantissa / 8.0, -6) : std::ldexp(1.0 + mantissa / 8.0, exponent - 7);
  return sign ? -magnitude : magnitude;
}

// The finite code nearest `value` (ties to the even code), saturating at +-448.
uint8_t nearest_code(double value) {
  uint8_t best = 0;
  double best_distance = std::numeric_limits<double>::infinity();
  for (int c = 0; c < 256; ++c) {
    const auto code = static_cast<uint8_t>(c);
    if (is_nan_code(code) || (std::signbit(value) != bool(code >> 7))) continue;
    const double distance = std::fabs(decode(code) - value);
    if (distance < best_distance || (distance == best_distance && (code & 1) == 0)) {
      best = code;
      best_distance = distance;
    }
  }
  return best;
}

TEST(E4m3, EveryCodeDecodesAsItsFieldsSay) {
  for (int c = 0; c < 256; ++c) {
    const auto code = static_cast<uint8_t>(c);
    if (is_nan_code(code)) {
      EXPECT_TRUE(std::isnan(e4m3_to_float(code))) << c;
      continue;
    }
    EXPECT_EQ(static_cast<double>(e4m3_to_float(code)), decode(code)) << c;
    EXPECT_EQ(e4m3_bits(e4m3_to_float(code)), code) << c;  // -0 included
  }
  EXPECT_EQ(e4m3_to_float(0x7e), kE4m3Max);
}

TEST(E4m3, MidpointsRoundToTheEvenCodeAndBeyond448Saturates) {
  for (int c = 0; c < 0x7e; ++c) {  // positive finite codes and their upper neighbour
    const double low = decode(static_cast<uint8_t>(c)), high = decode(static_cast<uint8_t>(c + 1));
    const float mid = static_cast<float>((low + high) / 2);  // exact in float
    const uint8_t even = (c % 2 == 0) ? static_cast<uint8_t>(c) : static_cast<uint8_t>(c + 1);
    EXPECT_EQ(e4m3_bits(mid), even) << "between codes " << c << " and " << c + 1;
    EXPECT_EQ(e4m3_bits(-mid), even | 0x80);
    EXPECT_EQ(e4m3_bits(std::nextafter(mid, 0.0f)), c);
    EXPECT_EQ(e4m3_bits(std::nextafter(mid, 1000.0f)), c + 1);
  }
  for (float big : {449.0f, 480.0f, 1e6f, std::numeric_limits<float>::infinity()}) {
    EXPECT_EQ(e4m3_bits(big), 0x7e) << big;
    EXPECT_EQ(e4m3_bits(-big), 0xfe) << big;
  }
  EXPECT_TRUE(is_nan_code(e4m3_bits(std::numeric_limits<float>::quiet_NaN())));
}

TEST(E4m3, RandomValuesRoundToTheNearestCode) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("CARACAL_TEST_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> log_magnitude(-12.0, 9.5);  // subnormals to saturation
  for (int i = 0; i < 20000; ++i) {
    const float value = static_cast<float>((i % 2 ? -1.0 : 1.0) * std::exp2(log_magnitude(rng)));
    ASSERT_EQ(e4m3_bits(value), nearest_code(value)) << value;
  }
}

TEST(BlockScale, ExactAndPowerOfTwoRules) {
  const BlockScale exact = block_scale(3.3f, ScaleRounding::kExact);
  EXPECT_EQ(exact.scale, 3.3f / 448.0f);
  EXPECT_EQ(exact.inverse, 448.0f / 3.3f);  // not 1 / scale, one ulp away for this amax
  EXPECT_NE(exact.inverse, 1.0f / exact.scale);
  EXPECT_EQ(block_scale(0.0f, ScaleRounding::kExact).scale, kMinBlockAmax / kE4m3Max);  // no division by 0
  for (float amax : {0.0f, 1e-4f, 0.37f, 1.0f, 448.0f, 896.0f, 1000.0f, 3e5f}) {
    const BlockScale p = block_scale(amax, ScaleRounding::kPowerOfTwo);
    int exponent = 0;
    EXPECT_EQ(std::frexp(p.scale, &exponent), 0.5f) << amax;  // a power of two
    const float needed = std::fmax(amax, kMinBlockAmax) / kE4m3Max;
    EXPECT_GE(p.scale, needed) << amax;
    EXPECT_LT(p.scale / 2, needed) << amax;
    EXPECT_EQ(p.inverse * p.scale, 1.0f) << amax;
  }
  EXPECT_EQ(block_scale(448.0f, ScaleRounding::kPowerOfTwo).scale, 1.0f);
}

// Values of a block's rows in [-bound, bound] with one of them at +-bound, some blocks tiny, one
// all zero, one NaN.
std::vector<float> random_values(std::mt19937_64& rng, int64_t count) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<double> log_scale(-20.0, 12.0);
  std::vector<float> values(static_cast<size_t>(count));
  for (size_t i = 0; i < values.size(); ++i) {
    if (i % 97 == 0) continue;  // exact zeros
    values[i] = normal(rng) * static_cast<float>(std::exp2(log_scale(rng)));
  }
  return values;
}

// |dequantized - x| within half an e4m3 step of x * inverse, in the block's scale: 2^-4 relative
// for normal codes, 2^-10 * s below 2^-6 (subnormal codes), saturated values aside.
void expect_within_half_a_step(double value, float x, float scale, const std::string& where) {
  const double scaled = std::fabs(static_cast<double>(x) / scale);
  const double half_step = scaled >= std::ldexp(1.0, -6) ? std::ldexp(scaled, -4) : std::ldexp(1.0, -10);
  const double bound = (half_step * (1 + 1e-6) + scaled * 1e-7) * scale;
  EXPECT_LE(std::fabs(value - x), bound) << where << ": x " << x << " scale " << scale;
}

TEST(QuantizeRows, EachRowBlockHasItsScaleAndItsLargestValueAt448) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("CARACAL_TEST_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const int64_t rows = 5, cols = 200;  // a full and a partial block per row
  std::vector<float> x = random_values(rng, rows * cols);
  for (int64_t c = 0; c < 128; ++c) x[2 * cols + c] = 0.0f;  // an all-zero block
  x[3 * cols + 150] = std::numeric_limits<float>::quiet_NaN();
  for (ScaleRounding rounding : {ScaleRounding::kExact, ScaleRounding::kPowerOfTwo}) {
    const Fp8Matrix q = quantize_rows(x, rows, cols, rounding);
    ASSERT_EQ(q.scale_cols(), 2);
    ASSERT_EQ(q.scales.size(), size_t(rows * 2));
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t b = 0; b < 2; ++b) {
        float amax = 0.0f;
        for (int64_t c = b * 128; c < std::min<int64_t>(cols, b * 128 + 128); ++c) {
          amax = std::fmax(amax, std::fabs(x[r * cols + c]));
        }
        EXPECT_EQ(q.scales[r * 2 + b], block_scale(amax, rounding).scale) << r << "," << b;
        for (int64_t c = b * 128; c < std::min<int64_t>(cols, b * 128 + 128); ++c) {
          const float v = x[r * cols + c];
          const std::string where = "row " + std::to_string(r) + " col " + std::to_string(c);
          if (std::isnan(v)) {
            EXPECT_TRUE(is_nan_code(q.codes[r * cols + c])) << where;
            continue;
          }
          EXPECT_FALSE(is_nan_code(q.codes[r * cols + c])) << where;
          expect_within_half_a_step(q.value(r, c), v, q.scale(r, c), where);
          if (rounding == ScaleRounding::kExact && std::fabs(v) == amax && amax >= kMinBlockAmax) {
            EXPECT_EQ(std::fabs(e4m3_to_float(q.codes[r * cols + c])), kE4m3Max) << where;
          }
        }
      }
    }
    const std::vector<double> all = dequantize(q);
    EXPECT_EQ(all[4 * cols + 7], q.value(4, 7));
    EXPECT_EQ(q.value(2, 5), 0.0);  // the all-zero block
  }
}

TEST(QuantizeBlocks, EachWeightBlockHasOneScale) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("CARACAL_TEST_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const int64_t rows = 130, cols = 260;  // partial blocks along both
  const std::vector<float> w = random_values(rng, rows * cols);
  const Fp8Matrix q = quantize_blocks(w, rows, cols);
  ASSERT_EQ(q.scale_cols(), 3);
  ASSERT_EQ(q.scales.size(), size_t(2 * 3));
  for (int64_t br = 0; br < 2; ++br) {
    for (int64_t bc = 0; bc < 3; ++bc) {
      float amax = 0.0f;
      for (int64_t r = br * 128; r < std::min<int64_t>(rows, br * 128 + 128); ++r) {
        for (int64_t c = bc * 128; c < std::min<int64_t>(cols, bc * 128 + 128); ++c) {
          amax = std::fmax(amax, std::fabs(w[r * cols + c]));
        }
      }
      EXPECT_EQ(q.scales[br * 3 + bc], block_scale(amax, ScaleRounding::kExact).scale) << br << "," << bc;
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      expect_within_half_a_step(q.value(r, c), w[r * cols + c], q.scale(r, c),
                                "row " + std::to_string(r) + " col " + std::to_string(c));
    }
  }
}

TEST(QuantizeRows, RefusesValuesThatAreNotRowsTimesCols) {
  test::expect_error([] { quantize_rows(std::vector<float>(10), 3, 4); }, {"quantize_rows", "rows * cols = 12", "10"});
  test::expect_error([] { quantize_blocks(std::vector<float>(10), 2, -5); }, {"quantize_blocks", "non-negative"});
}

}  // namespace
}  // namespace caracal
