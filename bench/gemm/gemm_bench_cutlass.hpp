#pragma once
// caracal_gemm_bench's CUTLASS baseline: CUTLASS's own grouped GEMM (cutlass_grouped_gemm.hpp),
// every configuration, on one case's real rows (the per-expert counts given on the host), for the
// forward's two GEMMs: up/gate (x · W_gate_up^T, N = 2I, K = D; plain output, no SwiGLU) and down
// (activation · W_down^T, N = D, K = I). One prepared GEMM per (input set, GEMM, schedule), since
// the ptr-array arguments name the operands.
#include <memory>
#include <vector>

#include "cutlass_grouped_gemm.hpp"
#include "gemm_bench_support.hpp"

namespace caracal::bench {

class CutlassBaseline {
 public:
  // `activation`: the down GEMM's A ([capacity][I], the rows our up kernel wrote).
  CutlassBaseline(const Case& c, const std::vector<int32_t>& offsets, const std::vector<InputSet>& sets,
                  const __nv_bfloat16* activation);

  void up(CutlassSchedule schedule, int iter) const { gemm(schedule, kUp, iter).run(nullptr); }
  void down(CutlassSchedule schedule, int iter) const { gemm(schedule, kDown, iter).run(nullptr); }

  // Relative Frobenius difference of the last output of up (down) from `ours` ([capacity][2I],
  // [capacity][D] bf16 on the device) over the case's real rows (every 7th row of each expert).
  double up_difference(const __nv_bfloat16* ours) const;
  double down_difference(const __nv_bfloat16* ours) const;

 private:
  enum Gemm { kUp = 0, kDown = 1 };
  CutlassGroupedGemm& gemm(CutlassSchedule schedule, Gemm which, int iter) const;
  double difference(const Bf16Array& theirs, const __nv_bfloat16* ours, int cols) const;

  const Case& c_;
  std::vector<int32_t> offsets_;
  int sets_;
  Bf16Array up_out_, down_out_;
  std::vector<std::unique_ptr<CutlassGroupedGemm>> gemms_;  // [set][gemm][kCutlassSchedules]
};

}  // namespace caracal::bench
