#pragma once
// caracal/block_fp8.hpp's exact scales (s = a / 448, inverse = 448 / a) without a division, for
// device code where the IEEE division's slow path, a function call, costs too much: the registers
// live across the call spill (the FP8 dgrad's epilogue holds the tile's accumulators there). Both
// quotients are taken in fp64 from a reciprocal refined by three Newton steps (any start within 2^-8
// of 1 / a converges to 2^-52) and rounded once to fp32; for every block amax of bf16 values (a a
// bf16 value or kMinBlockAmax, up to +inf) that is the correctly rounded fp32 quotient, the
// host's bits (test_exact_block_scale: every such amax, starts off by up to 2^-8).
#include <cmath>

#include "caracal/block_fp8.hpp"
#include "device/common/host_device.hpp"

namespace caracal::quant {

// block_scale(amax, ScaleRounding::kExact) for an amax that is not NaN, given `reciprocal` within
// 2^-8 of 1 / max(amax, kMinBlockAmax) (ignored where that is +inf).
CARACAL_HOST_DEVICE inline BlockScale exact_block_scale(float amax, double reciprocal) {
  const float a = amax > kMinBlockAmax ? amax : kMinBlockAmax;
  if (a == INFINITY) return {INFINITY, 0.0f};
  const double ad = a;
  double y = reciprocal;
  for (int step = 0; step < 3; ++step) y = fma(y, fma(-ad, y, 1.0), y);
  return {static_cast<float>(ad * (1.0 / double(kE4m3Max))), static_cast<float>(double(kE4m3Max) * y)};
}

}  // namespace caracal::quant
