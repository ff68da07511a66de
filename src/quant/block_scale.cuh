#pragma once
// A block's scale on the device: caracal/block_fp8.hpp's rule in the same fp32 operations.
#include <cuda_fp8.h>

#include <cstdint>

#include "caracal/block_fp8.hpp"
#include "quant/exact_block_scale.hpp"

namespace caracal::quant {

__device__ __forceinline__ BlockScale device_block_scale(float amax, ScaleRounding rounding) {
  const float a = fmaxf(amax, kMinBlockAmax);
  if (rounding == ScaleRounding::kExact) return {__fdiv_rn(a, kE4m3Max), __fdiv_rn(kE4m3Max, a)};
  // The smallest power of two at or above a / 448 (a normal float: a >= 1e-4).
  uint32_t bits = __float_as_uint(__fdiv_rn(a, kE4m3Max));
  bits = (bits & 0x007fffffu) != 0 ? (bits & 0x7f800000u) + 0x00800000u : bits & 0x7f800000u;
  const float scale = __uint_as_float(bits);
  return {scale, __fdiv_rn(1.0f, scale)};
}

__device__ __forceinline__ uint8_t e4m3_code(float value, float inverse) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(__fmul_rn(value, inverse), __NV_SATFINITE, __NV_E4M3));
}

// device_block_scale(amax, ScaleRounding::kExact) where amax is the largest magnitude of bf16
// values, without a division (exact_block_scale.hpp).
__device__ __forceinline__ BlockScale device_exact_block_scale(float amax) {
  double reciprocal;
  asm("rcp.approx.ftz.f64 %0, %1;" : "=d"(reciprocal) : "d"(double(fmaxf(amax, kMinBlockAmax))));
  return exact_block_scale(amax, reciprocal);
}

// e4m3_code of two values at once (one cvt of a pair, the same rounding): `lo` in the low byte.
__device__ __forceinline__ uint16_t e4m3_code_pair(float lo, float hi, float inverse) {
  return static_cast<uint16_t>(
      __nv_cvt_float2_to_fp8x2(make_float2(__fmul_rn(lo, inverse), __fmul_rn(hi, inverse)), __NV_SATFINITE, __NV_E4M3));
}

// e4m3_code of two values with scales of their own (lo's, hi's), one cvt of the pair.
__device__ __forceinline__ uint16_t e4m3_code_pair(float lo, float hi, float lo_inverse, float hi_inverse) {
  return static_cast<uint16_t>(__nv_cvt_float2_to_fp8x2(
      make_float2(__fmul_rn(lo, lo_inverse), __fmul_rn(hi, hi_inverse)), __NV_SATFINITE, __NV_E4M3));
}

// The largest of 32 lanes' values (fmaxf: a NaN does not count).
__device__ __forceinline__ float warp_max(float value) {
  for (int offset = 16; offset > 0; offset /= 2) value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
  return value;
}

}  // namespace caracal::quant
