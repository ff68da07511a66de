#pragma once
// A check of the gathered operands (src/device/gemm/gathered_rows.cuh) on their own, behind host
// functions so the GoogleTest source stays plain C++: one CTA TMA-loads a k tile of `expected` and
// gathers the same k tile from scattered rows of `matrix`, and returns both stages' bytes (both in
// the 128-byte swizzled layout the wgmma reads) and whether each stage's barrier completed within
// a bounded wait.
#include <cuda_bf16.h>

#include <cstdint>
#include <vector>

namespace caracal::test {

struct GatheredStage {
  std::vector<uint16_t> tma;       // the stage as the TMA laid it out
  std::vector<uint16_t> gathered;  // the same as the gather laid it out
  bool tma_done = false;
  bool gather_done = false;
};

// The K-major A operand of the fused forward's up/gate tiles (gather_k_tile), a 128 x 64 stage.
// matrix: device [rows][hidden] bf16; expected: device [128][hidden] bf16, expected[r] =
// matrix[source[r]] or zeros where source[r] < 0; source: host [128]; k_index: a multiple of 64.
GatheredStage gather_one_stage(const __nv_bfloat16* matrix, const __nv_bfloat16* expected,
                               const std::vector<int>& source, int hidden, int k_index);

// The MN-major operand of the weight gradients (gather_mn_k_tile), a 64 x 256 stage: expected:
// device [64][cols] bf16 as above, source: host [64]; the stage's columns start at `mn` (a multiple
// of 64; cols too), boxes past cols read from its last box as MNMajorRows loads them.
GatheredStage gather_one_mn_stage(const __nv_bfloat16* matrix, const __nv_bfloat16* expected,
                                  const std::vector<int>& source, int cols, int mn);

}  // namespace caracal::test
