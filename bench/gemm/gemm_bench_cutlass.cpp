#include "gemm_bench_cutlass.hpp"

#include <cmath>
#include <iterator>

namespace caracal::bench {

std::string cutlass_bf16_backward_name(CutlassBackwardSchedule schedule) {
  return schedule == CutlassBackwardSchedule::kCooperative ? "cooperative_128x256" : "pingpong";
}

double weight_grad_difference(const float* theirs, const float* ours, const std::vector<int>& counts, int m,
                              int n) {
  double diff = 0.0, norm = 0.0;
  std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
  for (size_t e = 0; e < counts.size(); ++e) {
    if (counts[e] == 0) continue;
    for (int r = 0; r < m; r += 61) {
      const size_t first = (e * size_t(m) + size_t(r)) * size_t(n);
      BENCH_CUDA(cudaMemcpy(a.data(), theirs + first, size_t(n) * sizeof(float), cudaMemcpyDeviceToHost));
      BENCH_CUDA(cudaMemcpy(b.data(), ours + first, size_t(n) * sizeof(float), cudaMemcpyDeviceToHost));
      for (int j = 0; j < n; ++j) {
        const double d = double(a[size_t(j)]) - double(b[size_t(j)]);
        diff += d * d;
        norm += double(b[size_t(j)]) * double(b[size_t(j)]);
      }
    }
  }
  return norm > 0.0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

CutlassBaseline::CutlassBaseline(const Case& c, const std::vector<int32_t>& offsets,
                                 const std::vector<InputSet>& sets, const __nv_bfloat16* activation,
                                 const __nv_bfloat16* d_gate_up, const __nv_bfloat16* scaled_activation)
    : c_(c), offsets_(offsets), sets_(int(sets.size())) {
  const size_t capacity = size_t(offsets.back());
  const int D = c.hidden, I = c.intermediate;
  const size_t L = size_t(c.num_experts);
  up_out_.resize(capacity * 2 * size_t(I));
  down_out_.resize(capacity * size_t(D));
  dgrad_out_.resize(capacity * size_t(I));
  dx_out_.resize(capacity * size_t(D));
  d_w_gate_up_.resize(L * 2 * size_t(I) * size_t(D));
  d_w_down_.resize(L * size_t(D) * size_t(I));
  CutlassGroupedProblem problem;
  problem.row_begin.assign(offsets.begin(), offsets.end() - 1);
  problem.rows.assign(c.counts.begin(), c.counts.end());
  CutlassExpertRows experts{problem.row_begin, problem.rows};
  for (const InputSet& set : sets) {
    for (Gemm which : {kUp, kDown}) {
      problem.n = which == kUp ? 2 * I : D;
      problem.k = which == kUp ? D : I;
      problem.a = which == kUp ? set.x.get() : activation;
      problem.b = which == kUp ? set.w_gate_up.get() : set.w_down.get();
      problem.d = which == kUp ? up_out_.get() : down_out_.get();
      for (CutlassSchedule schedule : kCutlassSchedules) gemms_.push_back(make_cutlass_grouped_gemm(schedule, problem));
    }
    const CutlassRowGemmProblem dgrad{experts, I, D, set.dy.get(), set.w_down.get(), dgrad_out_.get()};
    const CutlassRowGemmProblem dx{experts, D, 2 * I, d_gate_up, set.w_gate_up.get(), dx_out_.get()};
    const CutlassWeightGradProblem wgrad_gate_up{experts, 2 * I, D, d_gate_up, set.x.get(), d_w_gate_up_.get()};
    const CutlassWeightGradProblem wgrad_down{experts, D, I, set.dy.get(), scaled_activation, d_w_down_.get()};
    for (Backward which : {kDgrad, kDx, kWgradGateUp, kWgradDown}) {
      for (CutlassBackwardSchedule schedule : kCutlassBackwardSchedules) {
        switch (which) {
          case kDgrad: backward_.push_back(make_cutlass_row_gemm(schedule, dgrad)); break;
          case kDx: backward_.push_back(make_cutlass_row_gemm(schedule, dx)); break;
          case kWgradGateUp: backward_.push_back(make_cutlass_weight_grads(schedule, wgrad_gate_up)); break;
          default: backward_.push_back(make_cutlass_weight_grads(schedule, wgrad_down)); break;
        }
      }
    }
  }
}

CutlassGroupedGemm& CutlassBaseline::gemm(CutlassSchedule schedule, Gemm which, int iter) const {
  const size_t set = size_t(iter % sets_);
  const size_t s = size_t(schedule);  // its place in kCutlassSchedules
  return *gemms_[(set * 2 + size_t(which)) * kNumCutlassSchedules + s];
}

CutlassGroupedGemm& CutlassBaseline::backward(CutlassBackwardSchedule schedule, Backward which, int iter) const {
  constexpr size_t kSchedules = std::size(kCutlassBackwardSchedules);
  const size_t set = size_t(iter % sets_);
  return *backward_[(set * kNumBackward + size_t(which)) * kSchedules + size_t(schedule)];
}

double CutlassBaseline::up_difference(const __nv_bfloat16* ours) const {
  return difference(up_out_, ours, 2 * c_.intermediate);
}

double CutlassBaseline::down_difference(const __nv_bfloat16* ours) const {
  return difference(down_out_, ours, c_.hidden);
}

double CutlassBaseline::dx_difference(const __nv_bfloat16* ours) const { return difference(dx_out_, ours, c_.hidden); }

double CutlassBaseline::wgrad_difference(const float* ours_gate_up, const float* ours_down) const {
  return std::fmax(
      weight_grad_difference(d_w_gate_up_.get(), ours_gate_up, c_.counts, 2 * c_.intermediate, c_.hidden),
      weight_grad_difference(d_w_down_.get(), ours_down, c_.counts, c_.hidden, c_.intermediate));
}

double CutlassBaseline::difference(const Bf16Array& theirs, const __nv_bfloat16* ours, int cols) const {
  double diff = 0.0, norm = 0.0;
  for (size_t e = 0; e < c_.counts.size(); ++e) {
    for (int r = 0; r < c_.counts[e]; r += 7) {
      const size_t first = (size_t(offsets_[e]) + size_t(r)) * size_t(cols);
      const std::vector<double> a = download_bf16(theirs.get() + first, size_t(cols));
      const std::vector<double> b = download_bf16(ours + first, size_t(cols));
      for (int j = 0; j < cols; ++j) {
        diff += (a[size_t(j)] - b[size_t(j)]) * (a[size_t(j)] - b[size_t(j)]);
        norm += b[size_t(j)] * b[size_t(j)];
      }
    }
  }
  return norm > 0.0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

}  // namespace caracal::bench
