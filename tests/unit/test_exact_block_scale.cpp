// quant::exact_block_scale (src/quant/exact_block_scale.hpp), the division-free exact scales of the
// FP8 dgrad's epilogue: for every amax a block of bf16 values can have (each non-negative bf16
// value, +inf) and starts of the reciprocal as far off as 2^-8, both scales are block_scale's
// (caracal/block_fp8.hpp, the host's IEEE divisions) bit for bit; and without its Newton steps they
// would not be, so the comparison can fail.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "caracal/block_fp8.hpp"
#include "quant/exact_block_scale.hpp"

namespace caracal {
namespace {

uint32_t bits(float v) {
  uint32_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

// Every non-negative bf16 value but NaN (the largest magnitudes fmaxf can return), +inf included.
std::vector<float> bf16_amaxes() {
  std::vector<float> out;
  for (uint32_t b = 0; b <= 0x7f80u; ++b) {
    float v;
    const uint32_t word = b << 16;
    std::memcpy(&v, &word, sizeof v);
    out.push_back(v);
  }
  return out;
}

// 1 / a moved by `relative`, and with the low 32 bits of its significand cleared (a reciprocal of
// the high word only, as a hardware approximation may give).
double start(float amax, double relative, bool high_word_only) {
  const double a = std::max(amax, kMinBlockAmax);
  double y = (1.0 / a) * (1.0 + relative);
  if (high_word_only) {
    uint64_t b;
    std::memcpy(&b, &y, sizeof b);
    b &= ~uint64_t(0xffffffffu);
    std::memcpy(&y, &b, sizeof y);
  }
  return y;
}

TEST(ExactBlockScale, IsBlockScaleBitForBitForEveryBf16Amax) {
  const std::vector<float> amaxes = bf16_amaxes();
  ASSERT_EQ(amaxes.size(), 0x7f81u);
  for (const double relative : {-0x1p-8, -0x1p-20, -0x1p-40, 0.0, 0x1p-40, 0x1p-20, 0x1p-8}) {
    for (const bool high_word_only : {false, true}) {
      size_t differ = 0;
      float first = 0.0f;
      for (const float amax : amaxes) {
        const BlockScale want = block_scale(amax, ScaleRounding::kExact);
        const BlockScale got = quant::exact_block_scale(amax, start(amax, relative, high_word_only));
        if (bits(got.scale) != bits(want.scale) || bits(got.inverse) != bits(want.inverse)) {
          if (differ++ == 0) first = amax;
        }
      }
      EXPECT_EQ(differ, 0u) << "start off by " << relative << (high_word_only ? " (high word only)" : "")
                            << ": scales differ from block_scale's for " << differ << " amaxes, e.g. " << first;
    }
  }
  // kMinBlockAmax itself (not a bf16 value) and an amax below it.
  for (const float amax : {kMinBlockAmax, 1e-6f}) {
    const BlockScale want = block_scale(amax, ScaleRounding::kExact);
    const BlockScale got = quant::exact_block_scale(amax, start(amax, 0x1p-8, false));
    EXPECT_EQ(bits(got.scale), bits(want.scale)) << amax;
    EXPECT_EQ(bits(got.inverse), bits(want.inverse)) << amax;
  }
}

// The comparison above can fail: the unrefined start, rounded to fp32, misses the exact inverse.
TEST(ExactBlockScale, AnUnrefinedReciprocalWouldBeCaught) {
  size_t differ = 0;
  for (const float amax : bf16_amaxes()) {
    if (amax == INFINITY) continue;
    const double y = start(amax, 0x1p-20, true);
    differ += bits(static_cast<float>(double(kE4m3Max) * y)) !=
              bits(block_scale(amax, ScaleRounding::kExact).inverse);
  }
  EXPECT_GT(differ, 1000u);
}

}  // namespace
}  // namespace caracal
