#include "gemm_bench_cutlass.hpp"

#include <cmath>

namespace caracal::bench {

CutlassBaseline::CutlassBaseline(const Case& c, const std::vector<int32_t>& offsets,
                                 const std::vector<InputSet>& sets, const __nv_bfloat16* activation)
    : c_(c), offsets_(offsets), sets_(int(sets.size())) {
  const size_t capacity = size_t(offsets.back());
  const int D = c.hidden, I = c.intermediate;
  up_out_.resize(capacity * 2 * size_t(I));
  down_out_.resize(capacity * size_t(D));
  CutlassGroupedProblem problem;
  problem.row_begin.assign(offsets.begin(), offsets.end() - 1);
  problem.rows.assign(c.counts.begin(), c.counts.end());
  for (const InputSet& set : sets) {
    for (Gemm which : {kUp, kDown}) {
      problem.n = which == kUp ? 2 * I : D;
      problem.k = which == kUp ? D : I;
      problem.a = which == kUp ? set.x.get() : activation;
      problem.b = which == kUp ? set.w_gate_up.get() : set.w_down.get();
      problem.d = which == kUp ? up_out_.get() : down_out_.get();
      for (CutlassSchedule schedule : kCutlassSchedules) gemms_.push_back(make_cutlass_grouped_gemm(schedule, problem));
    }
  }
}

CutlassGroupedGemm& CutlassBaseline::gemm(CutlassSchedule schedule, Gemm which, int iter) const {
  const size_t set = size_t(iter % sets_);
  const size_t s = size_t(schedule);  // its place in kCutlassSchedules
  return *gemms_[(set * 2 + size_t(which)) * kNumCutlassSchedules + s];
}

double CutlassBaseline::up_difference(const __nv_bfloat16* ours) const {
  return difference(up_out_, ours, 2 * c_.intermediate);
}

double CutlassBaseline::down_difference(const __nv_bfloat16* ours) const {
  return difference(down_out_, ours, c_.hidden);
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
