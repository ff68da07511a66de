#include "caracal/bf16.hpp"

#include <cmath>
#include <cstring>

namespace caracal {

namespace {
constexpr uint32_t kQuietNanBit = 0x0040;  // top mantissa bit of a bf16
}  // namespace

uint16_t bf16_bits(float value) {
  uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof bits);
  // Truncating a NaN whose payload sits in the low half would turn it into Inf: keep it a NaN.
  if (std::isnan(value)) return static_cast<uint16_t>((bits >> 16) | kQuietNanBit);
  // Round to nearest even: add 0x7fff plus the lowest kept bit, then truncate. A carry out of
  // the mantissa bumps the exponent, which also rounds the largest finite values to Inf.
  const uint32_t lowest_kept_bit = (bits >> 16) & 1u;
  bits += 0x7fffu + lowest_kept_bit;
  return static_cast<uint16_t>(bits >> 16);
}

float bf16_to_float(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float value = 0.0f;
  std::memcpy(&value, &wide, sizeof value);
  return value;
}

double round_to_bf16(double value) {
  return static_cast<double>(bf16_to_float(bf16_bits(static_cast<float>(value))));
}

std::vector<uint16_t> to_bf16_bits(const std::vector<double>& values) {
  std::vector<uint16_t> bits(values.size());
  for (size_t i = 0; i < values.size(); ++i) bits[i] = bf16_bits(static_cast<float>(values[i]));
  return bits;
}

std::vector<double> from_bf16_bits(const std::vector<uint16_t>& bits) {
  std::vector<double> values(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) values[i] = static_cast<double>(bf16_to_float(bits[i]));
  return values;
}

}  // namespace caracal
