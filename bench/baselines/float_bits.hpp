#pragma once
// An fp32 value's bits, for the bitwise checks of the benchmarks and the tests (NaNs compare by
// their bits too).
#include <cstdint>
#include <cstring>

namespace caracal {

inline uint32_t float_bits(float value) {
  uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

}  // namespace caracal
