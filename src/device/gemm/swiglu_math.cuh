#pragma once
// SwiGLU in fp32, shared by the forward epilogue and the backward one that recomputes hidden:
// both must produce the same bits from the same bf16 gate/up. Accurate expf and IEEE division,
// and the _rn intrinsics keep the compiler from contracting the adds and multiplies into FMAs
// differently in the two contexts.
#include <cuda_bf16.h>

namespace caracal::gemm {

__device__ inline float round_to_bf16(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

// 1 + exp(-g): SiLU(g) = g / it, sigmoid(g) = 1 / it.
__device__ inline float silu_denominator(float g) { return __fadd_rn(1.0f, expf(-g)); }

// SiLU(g) * u, the value the forward rounds to bf16 as hidden.
__device__ inline float swiglu(float g, float u) {
  return __fmul_rn(__fdiv_rn(g, silu_denominator(g)), u);
}

}  // namespace caracal::gemm
