#pragma once
// A check of the gathered A operand (src/device/gemm/gathered_rows.cuh) on its own, behind a host
// function so the GoogleTest source stays plain C++: one CTA TMA-loads a 128 x 64 tile of
// `expected` and gathers the same k tile from scattered rows of `matrix`, and returns both stages'
// bytes (both in the 128-byte swizzled layout the wgmma reads) and whether each stage's barrier
// completed within a bounded wait.
#include <cuda_bf16.h>

#include <cstdint>
#include <vector>

namespace caracal::test {

struct GatheredStage {
  std::vector<uint16_t> tma;       // 128 x 64 bf16 as the TMA laid them out
  std::vector<uint16_t> gathered;  // the same as the gather laid them out
  bool tma_done = false;
  bool gather_done = false;
};

// matrix: device [rows][hidden] bf16; expected: device [128][hidden] bf16, expected[r] =
// matrix[source[r]] or zeros where source[r] < 0; source: host [128]; k_index: a multiple of 64.
GatheredStage gather_one_stage(const __nv_bfloat16* matrix, const __nv_bfloat16* expected,
                               const std::vector<int>& source, int hidden, int k_index);

}  // namespace caracal::test
