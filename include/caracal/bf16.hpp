#pragma once
// Host bf16 helpers: build bf16 buffers for the GPU, read them back, and round fp64 values the
// way a kernel stores an fp32 accumulator as bf16.
//
// bf16 is the upper half of an IEEE binary32: 1 sign, 8 exponent and 7 mantissa bits. Rounding is
// to nearest, ties to even; NaN stays NaN (quiet), +-Inf stays +-Inf, and finite values beyond
// the largest bf16 round to +-Inf as IEEE rounding prescribes.
#include <cstdint>
#include <vector>

namespace caracal {

// The bits of the bf16 nearest to `value`.
uint16_t bf16_bits(float value);
// The float whose upper half is `bits` (exact: every bf16 is a float).
float bf16_to_float(uint16_t bits);

// Rounds through float, as a kernel does with an fp32 result: double -> float -> bf16, both
// steps to nearest even. (The double rounding can differ from a direct double -> bf16 rounding
// by one bf16 ulp when the value lies within half a float ulp of a bf16 tie.)
double round_to_bf16(double value);

// Element-wise conversions for whole buffers (e.g. host copies of device tensors).
std::vector<uint16_t> to_bf16_bits(const std::vector<double>& values);
std::vector<double> from_bf16_bits(const std::vector<uint16_t>& bits);

}  // namespace caracal
