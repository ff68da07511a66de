#pragma once
// caracal_gemm_bench's cases: model shapes with the per-expert row counts of one receiving rank.
#include <cstdint>
#include <vector>

#include "gemm_bench_support.hpp"

namespace caracal::bench {

// The routing every case is cut from: T tokens per rank, top-k over E experts at W ranks.
inline constexpr int kWorld = 8;
inline constexpr int kTokens = 4096;

// DeepSeek-V3, Kimi K2 and Qwen3.5-397B, each under uniform and Zipf routing (rank 0 for uniform
// routing, the busiest rank for Zipf), and DeepSeek-V3 uniform with empty and one-row experts.
std::vector<Case> make_cases(uint64_t seed);

}  // namespace caracal::bench
