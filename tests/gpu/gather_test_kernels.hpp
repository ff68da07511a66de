#pragma once
// A check of the gathered A operand (src/device/gemm/gathered_rows.cuh) on its own, behind a host
// function so the GoogleTest source stays plain C++: one CTA TMA-loads a 128 x 64 tile of
// `expected` in one box, and gathers the same k tile row by row (one TMA box of 1 x 64 a row, as the
// fused forward's producer does) from the rows `sources` name, and returns both stages' bytes (both
// in the 128-byte swizzled layout the wgmma reads) and whether each stage's barrier completed
// within a bounded wait.
#include <cuda_bf16.h>

#include <cstdint>
#include <vector>

namespace caracal::test {

struct GatheredStage {
  std::vector<uint16_t> tma;       // 128 x 64 bf16 as one TMA box laid them out
  std::vector<uint16_t> gathered;  // the same as the row-by-row gather laid them out
  bool tma_done = false;
  bool gather_done = false;
};

// Row r of a tile: row `row` of rank `rank`'s home rows, or of its pulled rows, or padding (zeros).
struct GatherSource {
  enum Kind { kHome, kPulled, kPadding } kind = kPadding;
  int rank = 0;
  int row = 0;
};

// Two row tensors, [ranks][rows][hidden] bf16 on the device, rank r's rows at r * spacing
// elements from the first: home (home_rows rows a rank) and pulled (pulled_rows). expected: device
// [128][hidden], the rows `sources` (128 of them) name. k_index: a multiple of 64.
struct GatherTensors {
  const __nv_bfloat16* home = nullptr;
  int home_rows = 0;
  const __nv_bfloat16* pulled = nullptr;
  int pulled_rows = 0;
  int ranks = 1;
  int64_t spacing = 0;  // elements, a multiple of 8
  int hidden = 0;
};
GatheredStage gather_one_stage(const GatherTensors& tensors, const __nv_bfloat16* expected,
                               const std::vector<GatherSource>& sources, int k_index);

}  // namespace caracal::test
