#pragma once
// CUTLASS's own SM90 ptr-array grouped GEMMs on the backward's operands as Caracal lays them out, the
// baselines of its backward GEMMs (the forward's are cutlass_grouped_gemm.hpp's). Per expert e with
// buffer rows [row_begin[e], row_begin[e] + rows[e]) (row_begin a multiple of 128, the rows after
// the real ones up to the next block holding zeros; 0 rows skips the expert):
//
// - Row GEMMs (the dgrad's product, dx): D_e = A_e · W_e, A_e those rows of a ([*][K] bf16),
//   W_e = b + e * K * N ([K][N] bf16: the weights as the forward stores them, N contiguous), D_e the
//   same rows of d ([*][N] bf16). No SwiGLU: the plain product.
// - Weight gradients: dW_e = lhs_e^T · rhs_e (K = the expert's rows), stored in fp32 at
//   d + e * M * N ([M][N]). bf16: lhs [*][M] and rhs [*][N] rows as the layer holds them (both
//   operands MN-major). FP8 (DeepSeek-V3's recipe, as caracal/gemm/grouped_gemm_backward_fp8.hpp's
//   Fp8ColumnOperand): lhs and rhs quantized down their columns, codes [M][capacity] and
//   [N][capacity] (K-major), scales [capacity / 128][M] and [capacity / 128][N], one per column and
//   128-row block, promoted every 128 rows; K the rows rounded up to the block (the bf16 GEMMs take
//   the real rows: the host knows them, CUTLASS's advantage over Caracal's kernels).
//
// Problem sizes are known on the host. Two schedules each, one kernel instantiation per .cu:
// cooperative (both consumer warpgroups on one tile) and ping-pong (each consumer warpgroup on its
// own tile, one's epilogue under the other's mainloop).
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <iterator>
#include <memory>
#include <vector>

#include "cutlass_grouped_gemm_runner.hpp"

namespace caracal::bench {

enum class CutlassBackwardSchedule { kCooperative, kPingpong };
inline constexpr CutlassBackwardSchedule kCutlassBackwardSchedules[] = {CutlassBackwardSchedule::kCooperative,
                                                                        CutlassBackwardSchedule::kPingpong};
const char* cutlass_backward_schedule_name(CutlassBackwardSchedule schedule);

struct CutlassExpertRows {
  std::vector<int64_t> row_begin;  // [experts] first buffer row, a multiple of 128
  std::vector<int64_t> rows;       // [experts] real rows (0: the expert is skipped)
};

struct CutlassRowGemmProblem {
  CutlassExpertRows experts;
  int n = 0;
  int k = 0;
  const __nv_bfloat16* a = nullptr;  // [*][K]
  const __nv_bfloat16* b = nullptr;  // [experts][K][N]
  __nv_bfloat16* d = nullptr;        // [*][N]
};

struct CutlassWeightGradProblem {
  CutlassExpertRows experts;
  int m = 0;
  int n = 0;
  const __nv_bfloat16* lhs = nullptr;  // [*][M]
  const __nv_bfloat16* rhs = nullptr;  // [*][N]
  float* d = nullptr;                  // [experts][M][N]
};

struct CutlassFp8WeightGradProblem {
  CutlassExpertRows experts;
  int m = 0;
  int n = 0;
  int64_t capacity = 0;  // buffer rows: the codes' row length
  const __nv_fp8_e4m3* lhs = nullptr;  // [M][capacity]
  const float* lhs_scales = nullptr;   // [capacity / 128][M]
  const __nv_fp8_e4m3* rhs = nullptr;  // [N][capacity]
  const float* rhs_scales = nullptr;   // [capacity / 128][N]
  float* d = nullptr;                  // [experts][M][N]
};

// Each sets up its arguments and workspace (allocates, copies to the device, synchronizes) and throws
// caracal::Error if CUTLASS cannot implement the problem.
std::unique_ptr<CutlassGroupedGemm> make_cutlass_row_gemm(CutlassBackwardSchedule schedule,
                                                          const CutlassRowGemmProblem& problem);
std::unique_ptr<CutlassGroupedGemm> make_cutlass_weight_grads(CutlassBackwardSchedule schedule,
                                                              const CutlassWeightGradProblem& problem);
std::unique_ptr<CutlassGroupedGemm> make_cutlass_fp8_weight_grads(CutlassBackwardSchedule schedule,
                                                                  const CutlassFp8WeightGradProblem& problem);

// The instantiations, one per translation unit (cutlass_backward_<kind>_<schedule>.cu).
std::unique_ptr<CutlassGroupedGemm> make_cutlass_row_gemm_cooperative(const CutlassRowGemmProblem& problem);
std::unique_ptr<CutlassGroupedGemm> make_cutlass_row_gemm_pingpong(const CutlassRowGemmProblem& problem);
std::unique_ptr<CutlassGroupedGemm> make_cutlass_weight_grads_cooperative(const CutlassWeightGradProblem& problem);
std::unique_ptr<CutlassGroupedGemm> make_cutlass_weight_grads_pingpong(const CutlassWeightGradProblem& problem);
std::unique_ptr<CutlassGroupedGemm> make_cutlass_fp8_weight_grads_cooperative(const CutlassFp8WeightGradProblem& problem);
std::unique_ptr<CutlassGroupedGemm> make_cutlass_fp8_weight_grads_pingpong(const CutlassFp8WeightGradProblem& problem);

}  // namespace caracal::bench
