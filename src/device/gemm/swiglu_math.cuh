#pragma once
// SwiGLU in fp32, shared by the forward epilogue and the backward one that recomputes the
// activation: both must produce the same bits from the same bf16 gate/up, so both take sigmoid
// and SiLU from here, and the _rn intrinsics keep the compiler from contracting the adds and
// multiplies into FMAs differently in the two contexts.
//
// exp2 and the reciprocal come straight from the special-function unit (ex2.approx,
// rcp.approx: about 2 ulp of fp32, some 2^-14 of a bf16 rounding step, far under the bf16
// roundings that follow). The accurate library routines (expf, IEEE division) put each
// element's math behind range checks and a slow-path call: the epilogues then ran one element
// at a time, their latency exposed, instead of interleaving a chunk's elements.
#include <cuda_bf16.h>

namespace caracal::gemm {

__device__ inline float round_to_bf16(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

__device__ inline float ex2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ inline float rcp_approx(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// sigmoid(g) = 1 / (1 + e^-g). For g below about -88, e^-g is inf and sigmoid 0: no NaN.
__device__ inline float sigmoid(float g) {
  constexpr float kMinusLog2e = -1.4426950408889634f;
  return rcp_approx(__fadd_rn(1.0f, ex2_approx(__fmul_rn(g, kMinusLog2e))));
}

// SiLU(g) = g * sigmoid(g), given sigmoid(g).
__device__ inline float silu(float g, float sigmoid_g) { return __fmul_rn(g, sigmoid_g); }

// SiLU(g) * u, the value the forward rounds to bf16 as the activation.
__device__ inline float swiglu(float g, float u) { return __fmul_rn(silu(g, sigmoid(g)), u); }

}  // namespace caracal::gemm
