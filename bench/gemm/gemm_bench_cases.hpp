#pragma once
// caracal_gemm_bench's cases: model shapes with the per-expert row counts of one receiving rank.
#include <cstdint>
#include <vector>

#include "gemm_bench_support.hpp"

namespace caracal::bench {

// The routing the EP8 cases are cut from: T tokens per rank, top-k over E experts at W ranks.
inline constexpr int kWorld = 8;
inline constexpr int kTokens = 4096;

// DeepSeek-V3, Kimi K2, Qwen3.5-397B and DeepSeek-V4-Pro as EP8 slices (T = 4096 a rank), each
// under uniform and Zipf routing (rank 0 for uniform routing, the busiest rank for Zipf);
// DeepSeek-V3 uniform with empty and one-row experts; and issue 49's fine-grained experts,
// Qwen3-30B-A3B (D 2048, I 768): an EP8 slice (16 experts, ~2048 rows each) and all 128 experts on
// one GPU at T = 8192 (~512 rows each).
std::vector<Case> make_cases(uint64_t seed);

}  // namespace caracal::bench
