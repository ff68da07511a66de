#pragma once
// Expert-contiguous rows as the grouped GEMMs take them (caracal/gemm/grouped_gemm.hpp): expert
// e's rows start at offsets[e], its segment padded to the 128-row M tile. Host-side helpers for the
// benchmarks that lay such rows out themselves (caracal_gemm_bench, caracal bench's NCCL baseline).
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "caracal/error.hpp"
#include "caracal/gemm/grouped_gemm.hpp"

namespace caracal::bench {

// The [L + 1] row offsets for counts[e] real rows of expert e; throws when they pass int32.
template <typename Count>
std::vector<int32_t> padded_offsets(const std::vector<Count>& counts) {
  constexpr int64_t kTile = gemm::kGroupedGemmTileM;
  std::vector<int32_t> offsets{0};
  int64_t at = 0;
  for (const Count count : counts) {
    at += (static_cast<int64_t>(count) + kTile - 1) / kTile * kTile;
    CARACAL_CHECK(at <= std::numeric_limits<int32_t>::max(), "padded expert rows: ", at,
                  " rows do not fit the kernels' int32 offsets");
    offsets.push_back(static_cast<int32_t>(at));
  }
  return offsets;
}

// A gate g in [0, 1) for every real row and 0 on padding rows, as reverse-combine leaves them; a
// pure function of the counts and the seed.
template <typename Count>
std::vector<float> padded_row_gates(const std::vector<Count>& counts, uint64_t seed) {
  const std::vector<int32_t> offsets = padded_offsets(counts);
  std::vector<float> g(static_cast<size_t>(offsets.back()), 0.0f);
  uint64_t state = seed;
  for (size_t e = 0; e < counts.size(); ++e) {
    for (int64_t i = 0; i < static_cast<int64_t>(counts[e]); ++i) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;  // LCG: any spread will do
      g[static_cast<size_t>(offsets[e]) + static_cast<size_t>(i)] =
          static_cast<float>(state >> 40) / static_cast<float>(1 << 24);
    }
  }
  return g;
}

}  // namespace caracal::bench
