#pragma once
// CUTLASS's own SM90 grouped GEMM (the ptr-array kernels of its example 57, bf16), as a baseline
// for Caracal's grouped GEMMs: per group g, D_g = A_g · B_g^T with
//   A_g = rows [row_begin[g], row_begin[g] + rows[g]) of a  ([*][K] bf16, K contiguous),
//   B_g = b + g * N * K                                     ([N][K] bf16, an expert's weights),
//   D_g = the same rows of d                                ([*][N] bf16),
// fp32 accumulation, rounded once to bf16. Problem sizes are known on the host (the baseline's
// advantage over Caracal's kernels, which read them on the device). Three configurations, one kernel
// instantiation per .cu: example 57's cooperative (two consumer warpgroups on one 256 x 128 tile,
// clusters of 1 x 2) and ping-pong (each consumer warpgroup on its own 128 x 128 tile, one's
// epilogue under the other's mainloop), and the cooperative kernel at Caracal's own tile (128 x 256,
// no cluster: the fastest CUTLASS up/gate configuration on Caracal's shapes).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "cutlass_grouped_gemm_runner.hpp"

namespace caracal::bench {

// The configurations, in the order of kCutlassSchedules (an enumerator's value is its place there).
enum class CutlassSchedule { kCooperative, kPingpong, kCooperativeOurTile };
inline constexpr CutlassSchedule kCutlassSchedules[] = {CutlassSchedule::kCooperative, CutlassSchedule::kPingpong,
                                                        CutlassSchedule::kCooperativeOurTile};
inline constexpr int kNumCutlassSchedules = int(std::size(kCutlassSchedules));

const char* cutlass_schedule_name(CutlassSchedule schedule);

struct CutlassGroupedProblem {
  std::vector<int64_t> row_begin;  // [groups] first row of each group in a and d
  std::vector<int64_t> rows;       // [groups] rows of each group (0: the group is skipped)
  int n = 0;
  int k = 0;
  const __nv_bfloat16* a = nullptr;
  const __nv_bfloat16* b = nullptr;
  __nv_bfloat16* d = nullptr;
};

// Sets up the arguments and workspace (setup: allocates, copies to the device, synchronizes).
// Throws caracal::Error if CUTLASS cannot implement the problem.
std::unique_ptr<CutlassGroupedGemm> make_cutlass_grouped_gemm(CutlassSchedule schedule,
                                                              const CutlassGroupedProblem& problem);

// One instantiation per translation unit (cutlass_grouped_gemm_cooperative.cu, _pingpong.cu,
// _cooperative_128x256.cu).
std::unique_ptr<CutlassGroupedGemm> make_cutlass_cooperative(const CutlassGroupedProblem& problem);
std::unique_ptr<CutlassGroupedGemm> make_cutlass_pingpong(const CutlassGroupedProblem& problem);
std::unique_ptr<CutlassGroupedGemm> make_cutlass_cooperative_our_tile(const CutlassGroupedProblem& problem);

}  // namespace caracal::bench
