#pragma once
// A check of the gate/up weights' 5-D view (gemm/tensor_map.hpp, make_gate_up_view_map) on its own,
// behind a host function so the GoogleTest source stays plain C++: one CTA loads the up/gate GEMM's
// B stage (256 weight rows x 64 columns at k, first row n0, expert e) by TMA three ways — today's
// 3-D map over the interleaved weights, the view over the same weights, the view over the same
// weights in [gate; up] halves — and returns each stage's bytes (128-byte swizzled, as the wgmma
// reads them) and whether its barrier completed within a bounded wait.
#include <cuda_bf16.h>

#include <array>
#include <cstdint>
#include <vector>

namespace caracal::test {

struct GateUpStages {
  std::array<std::vector<uint16_t>, 3> bytes;  // 3-D interleaved, view interleaved, view halves
  std::array<bool, 3> done{};
};

// interleaved, halves: device [experts][2I][hidden] bf16, the same weights in both row orders.
GateUpStages load_gate_up_stages(const __nv_bfloat16* interleaved, const __nv_bfloat16* halves, int experts,
                                 int intermediate, int hidden, int k, int n0, int expert);

}  // namespace caracal::test
