#pragma once
// caracal_gemm_bench's spot checks: a few real rows (and a few weight-gradient entries) of a case
// recomputed in fp64 on the host from the device's own inputs, with the bf16-rounding contract
// of caracal/reference.hpp. Rows picked: the first real row, a middle row of the largest expert,
// the last real row. NaN in the outputs propagates into the errors.
#include <cuda_bf16.h>

#include <cstdint>
#include <vector>

#include "gemm_bench_support.hpp"

namespace caracal::bench {

// Relative Frobenius error of hidden and y over the picked rows together.
double forward_spot_check(const Case& c, const InputSet& in, const Bf16Array& hidden,
                          const Bf16Array& y);

// What the backward produced, on the device, and the host-side row gates it used.
struct BackwardOutputs {
  const __nv_bfloat16* gate_up;        // the forward's saved gate_up
  const __nv_bfloat16* hidden;         // the forward's hidden
  const float* gates_host;             // [capacity]
  const __nv_bfloat16* d_gate_up;      // [capacity][2I]
  const __nv_bfloat16* dx;             // [capacity][D]
  const float* dg;                     // [capacity]
  const float* d_w_gate_up;            // [L][2I][D]
  const float* d_w_down;               // [L][D][I]
};

// Relative Frobenius errors over the picked rows (d_gate_up and dx together; dg) and over 16
// entries of each weight gradient of the largest expert (together).
struct BackwardCheck {
  double rows = 0.0, dg = 0.0, weights = 0.0;
  double worst() const;
};

BackwardCheck backward_spot_check(const Case& c, const InputSet& in, const BackwardOutputs& out);

}  // namespace caracal::bench
