#pragma once
// The order of the routed experts' gate and up rows (W_gate_up, and the GEMMs' gate_up columns),
// which the kernels, the layer and the fp64 reference share. Host and device; no CUDA headers.
#include <cstdint>

namespace caracal::gemm {

// Gate and up weight rows alternate in groups of this many (see gate_up_row below).
inline constexpr int kGateUpInterleave = 8;

// The interleaved up/gate layout. W_gate_up[e] is [2I][D] with
//     W_gate_up[e][gate_up_row(j, false)] = W_gate[e][j],
//     W_gate_up[e][gate_up_row(j, true)]  = W_up[e][j],        j in [0, I),
// i.e. rows alternate 8 gate rows, 8 up rows. Why 8: a wgmma accumulator gives each thread
// columns {8t + 2q, 8t + 2q + 1} for every 8-column group t, so with this interleave the thread
// holding gate_j also holds up_j, in the neighbouring group, and SwiGLU needs no data exchange.
// The stored gate_up output uses the same column order: gate_up[row][gate_up_row(j, up)].
// The order of W_gate_up's 2I rows in memory: interleaved (gate_up_row), or [gate; up] halves
// (W_gate then W_up, Hugging Face's gate_up_proj). The up/gate GEMM reads either in place.
enum class GateUpLayout { kInterleaved, kHalves };

constexpr int64_t gate_up_row(int64_t j, bool is_up) {
  return 2 * kGateUpInterleave * (j / kGateUpInterleave) + (is_up ? kGateUpInterleave : 0) +
         j % kGateUpInterleave;
}

}  // namespace caracal::gemm
