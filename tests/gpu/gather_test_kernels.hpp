#pragma once
// A check of the gathered A operand (src/device/gemm/gathered_rows.cuh) on its own, behind a host
// function so the GoogleTest source stays plain C++: one CTA TMA-loads a 128 x 64 tile of
// `expected`, gathers the same k tile from scattered rows of `matrix` with cp.async, and loads it
// a third way, one TMA box of 1 x 64 per row of `matrix` into the stage at 128 bytes a row (rows
// past the matrix zero-filled by the TMA), and returns the three stages' bytes (all in the 128-byte
// swizzled layout the wgmma reads) and whether each stage's barrier completed within a bounded
// wait. The third way is the question of docs/ARCHITECTURE.md's "next lever": whether the TMA
// swizzles a one-row box written at a 128-byte (not 1024-byte) aligned address as the row of a
// whole tile.
#include <cuda_bf16.h>

#include <cstdint>
#include <vector>

namespace caracal::test {

struct GatheredStage {
  std::vector<uint16_t> tma;       // 128 x 64 bf16 as the TMA laid them out
  std::vector<uint16_t> gathered;  // the same as the gather laid them out
  std::vector<uint16_t> row_tma;   // the same as one TMA box per row laid them out
  bool tma_done = false;
  bool gather_done = false;
  bool row_tma_done = false;
};

// matrix: device [rows][hidden] bf16; expected: device [128][hidden] bf16, expected[r] =
// matrix[source[r]] or zeros where source[r] < 0; source: host [128]; k_index: a multiple of 64.
GatheredStage gather_one_stage(const __nv_bfloat16* matrix, int matrix_rows, const __nv_bfloat16* expected,
                               const std::vector<int>& source, int hidden, int k_index);

}  // namespace caracal::test
