#include "gemm_spot_checks.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "caracal/bf16.hpp"
#include "caracal/gemm/grouped_gemm.hpp"

namespace caracal::bench {

std::vector<double> download_bf16(const __nv_bfloat16* p, size_t count) {
  std::vector<uint16_t> bits(count);
  BENCH_CUDA(cudaMemcpy(bits.data(), p, count * sizeof(uint16_t), cudaMemcpyDeviceToHost));
  return caracal::from_bf16_bits(bits);
}

namespace {

using caracal::gemm::gate_up_row;

int largest_expert(const Case& c) {
  int largest = 0;
  for (int e = 0; e < c.num_experts; ++e) {
    if (c.counts[size_t(e)] > c.counts[size_t(largest)]) largest = e;
  }
  return largest;
}

// (expert, row): the first real row, a middle row of the largest expert, the last real row.
std::vector<std::pair<int, int64_t>> picked_rows(const Case& c) {
  const std::vector<int32_t> offsets = c.offsets();
  std::vector<std::pair<int, int64_t>> picks;
  for (int e = 0; e < c.num_experts; ++e) {
    if (c.counts[size_t(e)] > 0) {
      picks.push_back({e, offsets[size_t(e)]});
      break;
    }
  }
  const int largest = largest_expert(c);
  if (c.counts[size_t(largest)] > 0) {
    picks.push_back({largest, offsets[size_t(largest)] + c.counts[size_t(largest)] / 2});
  }
  for (int e = c.num_experts - 1; e >= 0; --e) {
    if (c.counts[size_t(e)] > 0) {
      picks.push_back({e, offsets[size_t(e)] + c.counts[size_t(e)] - 1});
      break;
    }
  }
  return picks;
}

// Accumulates a relative Frobenius error; NaN in `got` propagates.
struct ErrorSum {
  double err2 = 0.0, ref2 = 0.0;
  void add(double got, double want) {
    err2 += (got - want) * (got - want);
    ref2 += want * want;
  }
  double rel() const { return ref2 > 0.0 ? std::sqrt(err2 / ref2) : std::sqrt(err2); }
};

double silu(double g) { return g / (1.0 + std::exp(-g)); }
double silu_grad(double g) {
  const double s = 1.0 / (1.0 + std::exp(-g));
  return s * (1.0 + g * (1.0 - s));
}

// An expert's weights, downloaded once for consecutive picks of that expert.
struct ExpertWeightsCache {
  int expert = -1;
  std::vector<double> w_gate_up;  // [2I][D] interleaved
  std::vector<double> w_down;     // [D][I]
  void load(const Case& c, const InputSet& in, int e) {
    if (e == expert) return;
    const size_t D = size_t(c.hidden), I = size_t(c.intermediate);
    w_gate_up = download_bf16(in.w_gate_up.get() + size_t(e) * 2 * I * D, 2 * I * D);
    w_down = download_bf16(in.w_down.get() + size_t(e) * D * I, D * I);
    expert = e;
  }
};

}  // namespace

double BackwardCheck::worst() const {
  if (std::isnan(rows) || std::isnan(dg) || std::isnan(weights)) {
    return std::numeric_limits<double>::quiet_NaN();
  }
  return std::max(rows, std::max(dg, weights));
}

double forward_spot_check(const Case& c, const InputSet& in, const Bf16Array& hidden,
                          const Bf16Array& y) {
  const size_t D = size_t(c.hidden), I = size_t(c.intermediate);
  ErrorSum err;
  ExpertWeightsCache w;
  for (const auto& [e, row] : picked_rows(c)) {
    w.load(c, in, e);
    const auto x = download_bf16(in.x.get() + size_t(row) * D, D);
    const auto h_dev = download_bf16(hidden.get() + size_t(row) * I, I);
    const auto y_dev = download_bf16(y.get() + size_t(row) * D, D);
    std::vector<double> h(I);
    for (size_t j = 0; j < I; ++j) {
      double g = 0.0, u = 0.0;
      const double* g_row = &w.w_gate_up[size_t(gate_up_row(int64_t(j), false)) * D];
      const double* u_row = &w.w_gate_up[size_t(gate_up_row(int64_t(j), true)) * D];
      for (size_t d = 0; d < D; ++d) {
        g += x[d] * g_row[d];
        u += x[d] * u_row[d];
      }
      g = caracal::round_to_bf16(g);
      u = caracal::round_to_bf16(u);
      h[j] = caracal::round_to_bf16(silu(g) * u);
      err.add(h_dev[j], h[j]);
    }
    for (size_t d = 0; d < D; ++d) {
      double acc = 0.0;
      for (size_t j = 0; j < I; ++j) acc += h[j] * w.w_down[d * I + j];
      err.add(y_dev[d], caracal::round_to_bf16(acc));
    }
  }
  return err.rel();
}

BackwardCheck backward_spot_check(const Case& c, const InputSet& in, const BackwardOutputs& out) {
  const size_t D = size_t(c.hidden), I = size_t(c.intermediate);
  ErrorSum rows, dg;
  ExpertWeightsCache w;
  std::vector<double> d_h(I), d_gate_up(2 * I);
  for (const auto& [e, row] : picked_rows(c)) {
    w.load(c, in, e);
    const auto dy = download_bf16(in.dy.get() + size_t(row) * D, D);
    const auto gate_up = download_bf16(out.gate_up + size_t(row) * 2 * I, 2 * I);
    const auto hidden = download_bf16(out.hidden + size_t(row) * I, I);
    const auto d_gate_up_dev = download_bf16(out.d_gate_up + size_t(row) * 2 * I, 2 * I);
    const auto dx_dev = download_bf16(out.dx + size_t(row) * D, D);
    const double g = double(out.gates_host[row]);

    std::fill(d_h.begin(), d_h.end(), 0.0);
    for (size_t d = 0; d < D; ++d) {
      for (size_t j = 0; j < I; ++j) d_h[j] += dy[d] * w.w_down[d * I + j];
    }
    double dg_ref = 0.0;
    for (size_t j = 0; j < I; ++j) {
      dg_ref += d_h[j] * hidden[j];
      const size_t gi = size_t(gate_up_row(int64_t(j), false));
      const size_t ui = size_t(gate_up_row(int64_t(j), true));
      d_gate_up[gi] = caracal::round_to_bf16(g * d_h[j] * gate_up[ui] * silu_grad(gate_up[gi]));
      d_gate_up[ui] = caracal::round_to_bf16(g * d_h[j] * silu(gate_up[gi]));
    }
    dg.add(double(download(out.dg + row, 1)[0]), dg_ref);
    for (size_t q = 0; q < 2 * I; ++q) rows.add(d_gate_up_dev[q], d_gate_up[q]);
    for (size_t d = 0; d < D; ++d) {
      double acc = 0.0;
      for (size_t q = 0; q < 2 * I; ++q) acc += d_gate_up[q] * w.w_gate_up[q * D + d];
      rows.add(dx_dev[d], caracal::round_to_bf16(acc));
    }
  }

  // 16 entries of each weight gradient of the largest expert, summed over all its rows from the
  // device's d_gate_up and hidden (what the contract's B5 reads).
  ErrorSum weights;
  const int e = largest_expert(c);
  const size_t n = size_t(c.counts[size_t(e)]);
  if (n > 0) {
    const size_t begin = size_t(c.offsets()[size_t(e)]);
    const auto x = download_bf16(in.x.get() + begin * D, n * D);
    const auto dy = download_bf16(in.dy.get() + begin * D, n * D);
    const auto d_gate_up_dev = download_bf16(out.d_gate_up + begin * 2 * I, n * 2 * I);
    const auto hidden = download_bf16(out.hidden + begin * I, n * I);
    for (size_t k = 0; k < 16; ++k) {
      const size_t q = (k * 2 * I / 16 + 3 * k) % (2 * I), d = (k * D / 16 + 5 * k) % D;
      double want = 0.0;
      for (size_t r = 0; r < n; ++r) want += d_gate_up_dev[r * 2 * I + q] * x[r * D + d];
      weights.add(double(download(out.d_w_gate_up + (size_t(e) * 2 * I + q) * D + d, 1)[0]),
                  want);
      const size_t m = (k * D / 16 + 7 * k) % D, j = (k * I / 16 + 2 * k) % I;
      want = 0.0;
      for (size_t r = 0; r < n; ++r) {
        want += double(out.gates_host[begin + r]) * dy[r * D + m] * hidden[r * I + j];
      }
      weights.add(double(download(out.d_w_down + (size_t(e) * D + m) * I + j, 1)[0]), want);
    }
  }
  return {rows.rel(), dg.rel(), weights.rel()};
}

}  // namespace caracal::bench
