#pragma once
// caracal_gemm_bench's FP8 half (issue 47): every input set's x, dy and weights (both orientations),
// and the activation our bf16 up/gate kernel wrote, quantized by src/quant's kernels (DeepSeek-V3's
// recipe, bf16 in, e4m3 codes and fp32 block scales out); our FP8 forward GEMMs
// (caracal/gemm/grouped_gemm_fp8.hpp), our FP8 dgrad and dx (caracal/gemm/grouped_gemm_backward_fp8.hpp,
// over the gate_up our bf16 up/gate kernel saved; dx on the dgrad's e4m3 d_gate_up), our FP8 weight
// gradients (x, dy and our bf16 dgrad's d_gate_up and g·activation quantized down their columns) and CUTLASS's
// blockwise-scaled FP8 grouped GEMM (cutlass_fp8_grouped_gemm.hpp; the weight gradients'
// cutlass_backward_gemms.hpp, both schedules) on them, CUTLASS's outputs compared with ours. Cases
// whose D and I are multiples of 128 only.
#include <cstdint>
#include <iterator>
#include <memory>
#include <vector>

#include "caracal/schedule_view.hpp"
#include "cutlass_backward_gemms.hpp"
#include "cutlass_fp8_grouped_gemm.hpp"
#include "gemm_bench_support.hpp"

namespace caracal::bench {

class Fp8Gemms {
 public:
  static bool supported(const Case& c) { return c.hidden % 128 == 0 && c.intermediate % 128 == 0; }

  // `activation`, `gate_up`: our bf16 up/gate's [capacity][I] and [capacity][2I] outputs (the down
  // GEMMs' A, quantized once; the dgrad's saved gate_up); `gates`: g per row; `d_gate_up`,
  // `scaled_activation`: our bf16 dgrad's outputs (the weight gradients' operands);
  // `cutlass_d_w_gate_up`, `cutlass_d_w_down`: where CUTLASS's FP8 weight gradients go (fp32
  // [L][2I][D], [L][D][I]; the bf16 baseline's, to keep one copy in memory).
  Fp8Gemms(const Case& c, const std::vector<int32_t>& offsets, const std::vector<InputSet>& sets,
           const __nv_bfloat16* activation, const __nv_bfloat16* gate_up, const float* gates,
           const __nv_bfloat16* d_gate_up, const __nv_bfloat16* scaled_activation, const ScheduleView& rows,
           uint32_t* tile_queue, float* cutlass_d_w_gate_up, float* cutlass_d_w_down);

  void up(int iter) const;     // ours, storing gate_up and the activation
  // Ours as the layer runs it: gate_up, and the activation in e4m3 only, into the down GEMM's rows
  // (the bits quantize_activation makes of up's).
  void up_e4m3(int iter) const;
  void down(int iter) const;   // ours
  // Our up's bf16 activation into the down GEMM's e4m3 rows and 1 x 128 scales (quant::quantize_rows
  // over every buffer row): what an FP8 forward adds between its two GEMMs.
  void quantize_activation(int iter) const;
  void dgrad(int iter) const;  // ours, storing d_gate_up in bf16 and e4m3
  void dx(int iter) const;     // ours, on the last dgrad's e4m3 d_gate_up
  // The weight gradients' four operands quantized down their columns (quant::quantize_columns): what
  // an FP8 backward adds before its weight gradients.
  void quantize_wgrad_operands(int iter) const;
  void wgrad(int iter, bool bf16_grads = false) const;  // ours, fp32 (or bf16) gradients
  void cutlass_up(int iter) const { cutlass_[set_of(iter) * 2]->run(nullptr); }
  void cutlass_down(int iter) const { cutlass_[set_of(iter) * 2 + 1]->run(nullptr); }
  void cutlass_wgrad(CutlassBackwardSchedule schedule, int iter) const {
    const size_t first = (set_of(iter) * std::size(kCutlassBackwardSchedules) + size_t(schedule)) * 2;
    cutlass_wgrad_[first]->run(nullptr);
    cutlass_wgrad_[first + 1]->run(nullptr);
  }

  // Relative Frobenius difference of CUTLASS's last up (down) output from ours, over the case's real
  // rows (every 7th row of each expert).
  double up_difference() const;
  double down_difference() const;
  // CUTLASS's last FP8 weight gradients against our last fp32 ones (sampled rows, the worse of the two).
  double wgrad_difference() const;
  // FNV-1a (64-bit) over the bits of the real rows of our last up (gate_up and the activation), down,
  // dgrad (d_gate_up, g·activation) and dx outputs: two builds with equal digests computed the same bits.
  uint64_t output_digest() const;

 private:
  struct Rows {  // e4m3 rows and their scales [K/128][capacity]
    DeviceArray<uint8_t> codes;
    DeviceArray<float> scales;
  };
  struct Weights {  // e4m3 weights [L][N][K] and their scales, ours and CUTLASS's layout; transposed
    DeviceArray<uint8_t> codes, codes_t;
    DeviceArray<float> scales, cutlass_scales, scales_t;
  };
  struct Set {
    Rows x, dy;
    Rows x_columns, dy_columns;  // quantized down the columns: codes [K][capacity], scales [capacity/128][K]
    Weights w_gate_up, w_down;
  };

  size_t set_of(int iter) const { return size_t(iter % int(sets_.size())); }
  // Arguments of one of our FP8 GEMMs with what they all share set: the rows, D, I, the tile queue.
  template <class Args>
  Args gemm_args() const;
  void quantize_rows(const __nv_bfloat16* values, int cols, Rows& out) const;
  // The same into `out` as sized (no allocation: timed).
  void quantize_rows_into(const __nv_bfloat16* values, int cols, const Rows& out) const;
  void quantize_weights(const __nv_bfloat16* values, int n, int k, Weights& out) const;
  void quantize_columns(const __nv_bfloat16* values, int cols, Rows& out) const;
  void quantize_columns_into(const __nv_bfloat16* values, int cols, const Rows& out) const;
  // CUTLASS's per-expert copy of row scales (cutlass_fp8_grouped_gemm.hpp: [K/128][rows of the expert]).
  void cutlass_row_scales(const Rows& rows, int k, DeviceArray<float>& out, std::vector<int64_t>& offsets) const;
  double difference(const Bf16Array& theirs, const Bf16Array& ours, int cols) const;

  const Case& c_;
  const std::vector<InputSet>& inputs_;  // bf16 x and dy of each set (the caller's)
  std::vector<int32_t> offsets_;
  ScheduleView rows_;
  uint32_t* tile_queue_;
  std::vector<Set> sets_;
  Rows activation_, d_gate_up_fp8_;
  const __nv_bfloat16* saved_gate_up_;
  const float* gates_;
  const __nv_bfloat16* bf16_d_gate_up_;
  const __nv_bfloat16* bf16_scaled_activation_;
  Rows d_gate_up_columns_, scaled_activation_columns_;
  DeviceArray<float> d_w_gate_up_, d_w_down_;
  Bf16Array d_w_gate_up_bf16_, d_w_down_bf16_;
  Bf16Array hidden_, gate_up_, y_, d_gate_up_, scaled_activation_, dx_, cutlass_up_out_, cutlass_down_out_;
  DeviceArray<float> dg_, workspace_;
  std::vector<DeviceArray<float>> cutlass_sfa_;                    // per set: x's; then the activation's
  std::vector<std::unique_ptr<CutlassGroupedGemm>> cutlass_;  // [set][up, down]
  float* cutlass_d_w_gate_up_;
  float* cutlass_d_w_down_;
  std::vector<std::unique_ptr<CutlassGroupedGemm>> cutlass_wgrad_;  // [set][schedule][gate_up, down]
};

}  // namespace caracal::bench
