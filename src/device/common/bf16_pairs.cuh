#pragma once
// Two floats rounded to bf16 (nearest even, as caracal::bf16_bits does on the host) in one 32-bit
// word, the first in the low half (the lower address): how the GEMM epilogues and the transfers'
// slot sums store bf16 pairs; and back.
#include <cstdint>

namespace caracal {

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  uint32_t pair;  // cvt puts its first source in the upper half
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(pair) : "f"(hi), "f"(lo));
  return pair;
}

// The two floats of such a word (exact).
__device__ __forceinline__ float bf16_low(uint32_t pair) { return __uint_as_float(pair << 16); }
__device__ __forceinline__ float bf16_high(uint32_t pair) { return __uint_as_float(pair & 0xFFFF0000u); }

}  // namespace caracal
