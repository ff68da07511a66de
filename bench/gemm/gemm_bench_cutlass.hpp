#pragma once
// caracal_gemm_bench's CUTLASS baselines on one case's real rows (the per-expert counts given on the
// host): CUTLASS's own grouped GEMM (cutlass_grouped_gemm.hpp), every configuration, for the
// forward's two GEMMs: up/gate (x · W_gate_up^T, N = 2I, K = D; plain output, no SwiGLU) and down
// (activation · W_down^T, N = D, K = I); and the backward's (cutlass_backward_gemms.hpp), both
// schedules: the dgrad's product (dy · W_down, N = I, K = D; no SwiGLU), dx (d_gate_up · W_gate_up,
// N = D, K = 2I) and the weight gradients in fp32 (d_gate_up^T x and dy^T (g·activation), K = the
// expert's rows). One prepared GEMM per (input set, GEMM, schedule), since the ptr-array arguments
// name the operands.
#include <memory>
#include <string>
#include <vector>

#include "cutlass_backward_gemms.hpp"
#include "cutlass_grouped_gemm.hpp"
#include "gemm_bench_support.hpp"

namespace caracal::bench {

// A backward schedule's name in the timings: the bf16 cooperative runs Caracal's 128 x 256 tile.
std::string cutlass_bf16_backward_name(CutlassBackwardSchedule schedule);

// Relative Frobenius difference of fp32 weight gradients [experts][m][n] over every 61st row of each
// expert with rows (counts[e] > 0); both on the device.
double weight_grad_difference(const float* theirs, const float* ours, const std::vector<int>& counts, int m, int n);

class CutlassBaseline {
 public:
  // Our kernels' outputs the GEMMs read ([capacity] rows, set-independent): `activation` ([I], the
  // down GEMM's A), `d_gate_up` ([2I] interleaved, dx's A and dW_gate_up's lhs) and
  // `scaled_activation` ([I], g·activation, dW_down's rhs).
  CutlassBaseline(const Case& c, const std::vector<int32_t>& offsets, const std::vector<InputSet>& sets,
                  const __nv_bfloat16* activation, const __nv_bfloat16* d_gate_up,
                  const __nv_bfloat16* scaled_activation);

  void up(CutlassSchedule schedule, int iter) const { gemm(schedule, kUp, iter).run(nullptr); }
  void down(CutlassSchedule schedule, int iter) const { gemm(schedule, kDown, iter).run(nullptr); }
  void dgrad(CutlassBackwardSchedule schedule, int iter) const { backward(schedule, kDgrad, iter).run(nullptr); }
  void dx(CutlassBackwardSchedule schedule, int iter) const { backward(schedule, kDx, iter).run(nullptr); }
  void wgrad(CutlassBackwardSchedule schedule, int iter) const {
    backward(schedule, kWgradGateUp, iter).run(nullptr);
    backward(schedule, kWgradDown, iter).run(nullptr);
  }

  // Relative Frobenius difference of the last output of up (down, dx) from `ours` ([capacity][2I],
  // [capacity][D], [capacity][D] bf16 on the device) over the case's real rows (every 7th row of each
  // expert); of the last weight gradients from ours (fp32 [L][2I][D] and [L][D][I]), the worse.
  double up_difference(const __nv_bfloat16* ours) const;
  double down_difference(const __nv_bfloat16* ours) const;
  double dx_difference(const __nv_bfloat16* ours) const;
  double wgrad_difference(const float* ours_gate_up, const float* ours_down) const;

  // Where the weight gradients go (fp32), also given to the FP8 baseline: one copy of each in memory.
  float* d_w_gate_up() const { return d_w_gate_up_.get(); }
  float* d_w_down() const { return d_w_down_.get(); }

 private:
  enum Gemm { kUp = 0, kDown = 1 };
  enum Backward { kDgrad = 0, kDx, kWgradGateUp, kWgradDown, kNumBackward };
  CutlassGroupedGemm& gemm(CutlassSchedule schedule, Gemm which, int iter) const;
  CutlassGroupedGemm& backward(CutlassBackwardSchedule schedule, Backward which, int iter) const;
  double difference(const Bf16Array& theirs, const __nv_bfloat16* ours, int cols) const;

  const Case& c_;
  std::vector<int32_t> offsets_;
  int sets_;
  Bf16Array up_out_, down_out_, dgrad_out_, dx_out_;
  DeviceArray<float> d_w_gate_up_, d_w_down_;
  std::vector<std::unique_ptr<CutlassGroupedGemm>> gemms_;     // [set][gemm][kCutlassSchedules]
  std::vector<std::unique_ptr<CutlassGroupedGemm>> backward_;  // [set][Backward][kCutlassBackwardSchedules]
};

}  // namespace caracal::bench
