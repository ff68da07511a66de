#include "gemm_bench_fp8.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "caracal/gemm/grouped_gemm_backward_fp8.hpp"
#include "caracal/gemm/grouped_gemm_fp8.hpp"
#include "gemm_bench_cutlass.hpp"
#include "quant/quantize_fp8.hpp"

namespace caracal::bench {

namespace {

const __nv_fp8_e4m3* fp8(const DeviceArray<uint8_t>& codes) {
  return reinterpret_cast<const __nv_fp8_e4m3*>(codes.get());
}

}  // namespace

Fp8Gemms::Fp8Gemms(const Case& c, const std::vector<int32_t>& offsets, const std::vector<InputSet>& sets,
                   const __nv_bfloat16* activation, const __nv_bfloat16* gate_up, const float* gates,
                   const __nv_bfloat16* d_gate_up, const __nv_bfloat16* scaled_activation, const ScheduleView& rows,
                   uint32_t* tile_queue, float* cutlass_d_w_gate_up, float* cutlass_d_w_down)
    : c_(c), inputs_(sets), offsets_(offsets), rows_(rows), tile_queue_(tile_queue), sets_(sets.size()), saved_gate_up_(gate_up),
      gates_(gates), bf16_d_gate_up_(d_gate_up), bf16_scaled_activation_(scaled_activation),
      cutlass_d_w_gate_up_(cutlass_d_w_gate_up), cutlass_d_w_down_(cutlass_d_w_down) {
  const int D = c.hidden, I = c.intermediate;
  const size_t capacity = size_t(offsets.back());
  for (size_t s = 0; s < sets.size(); ++s) {
    quantize_rows(sets[s].x.get(), D, sets_[s].x);
    quantize_rows(sets[s].dy.get(), D, sets_[s].dy);
    quantize_weights(sets[s].w_gate_up.get(), 2 * I, D, sets_[s].w_gate_up);
    quantize_weights(sets[s].w_down.get(), D, I, sets_[s].w_down);
    quantize_columns(sets[s].x.get(), D, sets_[s].x_columns);
    quantize_columns(sets[s].dy.get(), D, sets_[s].dy_columns);
  }
  quantize_rows(activation, I, activation_);
  quantize_columns(d_gate_up, 2 * I, d_gate_up_columns_);
  quantize_columns(scaled_activation, I, scaled_activation_columns_);
  d_w_gate_up_.resize(size_t(c.num_experts) * 2 * size_t(I) * size_t(D));
  d_w_down_.resize(size_t(c.num_experts) * size_t(D) * size_t(I));
  d_w_gate_up_bf16_.resize(size_t(c.num_experts) * 2 * size_t(I) * size_t(D));
  d_w_down_bf16_.resize(size_t(c.num_experts) * size_t(D) * size_t(I));
  hidden_.resize(capacity * size_t(I));
  gate_up_.resize(capacity * 2 * size_t(I));
  y_.resize(capacity * size_t(D));
  d_gate_up_.resize(capacity * 2 * size_t(I));
  d_gate_up_fp8_.codes.resize(capacity * 2 * size_t(I));
  d_gate_up_fp8_.scales.resize(size_t(2 * I / 128) * capacity);
  scaled_activation_.resize(capacity * size_t(I));
  dx_.resize(capacity * size_t(D));
  dg_.resize(capacity);
  workspace_.resize(gemm::fp8_down_dgrad_workspace_floats(int(capacity), I));
  cutlass_up_out_.resize(capacity * 2 * size_t(I));
  cutlass_down_out_.resize(capacity * size_t(D));

  cutlass_sfa_.reserve(sets.size() + 1);  // references to its elements are held below
  CutlassFp8GroupedProblem problem;
  problem.row_begin.assign(offsets.begin(), offsets.end() - 1);
  problem.rows.assign(c.counts.begin(), c.counts.end());
  // Adds CUTLASS's GEMM d = a · b^T of the case's rows, a's scales in CUTLASS's layout (sfa, sfa_offset).
  const auto add_cutlass = [&](int n, int k, const Rows& a, const DeviceArray<float>& sfa,
                               const std::vector<int64_t>& sfa_offset, const Weights& b, Bf16Array& d) {
    problem.n = n;
    problem.k = k;
    problem.a = fp8(a.codes);
    problem.sfa = sfa.get();
    problem.sfa_offset = sfa_offset;
    problem.b = fp8(b.codes);
    problem.sfb = b.cutlass_scales.get();
    problem.d = d.get();
    cutlass_.push_back(make_cutlass_fp8_blockwise(problem));
  };
  DeviceArray<float>& activation_sfa = cutlass_sfa_.emplace_back();
  std::vector<int64_t> activation_offsets, x_offsets;
  cutlass_row_scales(activation_, I, activation_sfa, activation_offsets);
  for (const Set& set : sets_) {
    DeviceArray<float>& x_sfa = cutlass_sfa_.emplace_back();
    cutlass_row_scales(set.x, D, x_sfa, x_offsets);
    add_cutlass(2 * I, D, set.x, x_sfa, x_offsets, set.w_gate_up, cutlass_up_out_);
    add_cutlass(D, I, activation_, activation_sfa, activation_offsets, set.w_down, cutlass_down_out_);
  }
  // The weight gradients: dW_gate_up = d_gate_up^T x, dW_down = dy^T (g·activation) on the column
  // operands ours read.
  const CutlassExpertRows experts{problem.row_begin, problem.rows};
  const auto wgrad_problem = [&](const Rows& lhs, int m, const Rows& rhs, int n, float* d) {
    return CutlassFp8WeightGradProblem{experts,
                                       m,
                                       n,
                                       int64_t(capacity),
                                       fp8(lhs.codes),
                                       lhs.scales.get(),
                                       fp8(rhs.codes),
                                       rhs.scales.get(),
                                       d};
  };
  for (const Set& set : sets_) {
    for (CutlassBackwardSchedule schedule : kCutlassBackwardSchedules) {
      cutlass_wgrad_.push_back(make_cutlass_fp8_weight_grads(
          schedule, wgrad_problem(d_gate_up_columns_, 2 * I, set.x_columns, D, cutlass_d_w_gate_up_)));
      cutlass_wgrad_.push_back(make_cutlass_fp8_weight_grads(
          schedule, wgrad_problem(set.dy_columns, D, scaled_activation_columns_, I, cutlass_d_w_down_)));
    }
  }
  BENCH_CUDA(cudaDeviceSynchronize());
}

void Fp8Gemms::quantize_rows(const __nv_bfloat16* values, int cols, Rows& out) const {
  const int64_t capacity = offsets_.back();
  out.codes.resize(size_t(capacity) * size_t(cols));
  out.scales.resize(size_t((cols + 127) / 128) * size_t(capacity));
  quantize_rows_into(values, cols, out);
}

void Fp8Gemms::quantize_rows_into(const __nv_bfloat16* values, int cols, const Rows& out) const {
  const int64_t capacity = offsets_.back();
  quant::QuantizeRowsArgs a;
  a.values = values;
  a.rows = capacity;
  a.cols = cols;
  a.codes = reinterpret_cast<__nv_fp8_e4m3*>(out.codes.get());
  a.scales = out.scales.get();
  a.scale_row_stride = 1;  // [K/128][rows]: the GEMMs' layout
  a.scale_block_stride = capacity;
  quant::quantize_rows(a, nullptr);
}

void Fp8Gemms::quantize_columns(const __nv_bfloat16* values, int cols, Rows& out) const {
  const int64_t capacity = offsets_.back();
  out.codes.resize(size_t(capacity) * size_t(cols));
  out.scales.resize(size_t(capacity / 128) * size_t(cols));
  quantize_columns_into(values, cols, out);
}

void Fp8Gemms::quantize_columns_into(const __nv_bfloat16* values, int cols, const Rows& out) const {
  const int64_t capacity = offsets_.back();
  quant::QuantizeColumnsArgs a;
  a.values = values;
  a.rows = capacity;
  a.cols = cols;
  a.codes_t = reinterpret_cast<__nv_fp8_e4m3*>(out.codes.get());
  a.codes_row_stride = capacity;  // [K][capacity]
  a.scales = out.scales.get();
  a.scale_col_stride = 1;  // [capacity/128][K]: gemm::Fp8ColumnOperand's layout
  a.scale_block_stride = cols;
  quant::quantize_columns(a, nullptr);
}

void Fp8Gemms::quantize_weights(const __nv_bfloat16* values, int n, int k, Weights& out) const {
  const size_t L = size_t(c_.num_experts);
  const size_t nb = size_t(quant::weight_blocks(n)), kb = size_t(quant::weight_blocks(k));
  const size_t row = size_t(quant::weight_scale_row(int64_t(nb)));
  const size_t row_t = size_t(quant::weight_scale_row(int64_t(kb)));
  out.codes.resize(L * size_t(n) * size_t(k));
  out.scales.resize(L * kb * row);
  out.cutlass_scales.resize(L * kb * nb);
  out.codes_t.resize(L * size_t(n) * size_t(k));
  out.scales_t.resize(L * nb * row_t);
  quant::QuantizeWeightsArgs a;
  a.weights = values;
  a.experts = int64_t(L);
  a.n = n;
  a.k = k;
  a.codes = reinterpret_cast<__nv_fp8_e4m3*>(out.codes.get());
  a.scales = out.scales.get();
  a.codes_t = reinterpret_cast<__nv_fp8_e4m3*>(out.codes_t.get());
  a.scales_t = out.scales_t.get();
  quant::quantize_weights(a, nullptr);
  // CUTLASS's scales: [L][K/128][N/128] dense (ours: block nb at weight_scale_at(nb) of a row).
  std::vector<float> ours(L * kb * row), dense(L * kb * nb);
  BENCH_CUDA(cudaMemcpy(ours.data(), out.scales.get(), ours.size() * sizeof(float), cudaMemcpyDeviceToHost));
  for (size_t r = 0; r < L * kb; ++r) {
    for (size_t b = 0; b < nb; ++b) dense[r * nb + b] = ours[r * row + size_t(quant::weight_scale_at(int64_t(b)))];
  }
  BENCH_CUDA(cudaMemcpy(out.cutlass_scales.get(), dense.data(), dense.size() * sizeof(float), cudaMemcpyHostToDevice));
}

void Fp8Gemms::cutlass_row_scales(const Rows& rows, int k, DeviceArray<float>& out,
                                  std::vector<int64_t>& offsets) const {
  const size_t kb = size_t((k + 127) / 128), capacity = size_t(offsets_.back());
  out.resize(std::max<size_t>(1, kb * size_t(c_.rows())));
  offsets.assign(c_.counts.size(), 0);
  int64_t next = 0;
  for (size_t e = 0; e < c_.counts.size(); ++e) {
    offsets[e] = next;
    const size_t m = size_t(c_.counts[e]);
    if (m == 0) continue;
    BENCH_CUDA(cudaMemcpy2D(out.get() + next, m * 4, rows.scales.get() + offsets_[e], capacity * 4, m * 4, kb,
                            cudaMemcpyDeviceToDevice));
    next += int64_t(m * kb);
  }
}

template <class Args>
Args Fp8Gemms::gemm_args() const {
  Args a;
  a.rows = rows_;
  a.hidden = c_.hidden;
  a.intermediate = c_.intermediate;
  a.tile_queue = tile_queue_;
  return a;
}

void Fp8Gemms::up(int iter) const {
  const Set& s = sets_[set_of(iter)];
  auto a = gemm_args<gemm::Fp8UpGateSwigluArgs>();
  a.x = {fp8(s.x.codes), s.x.scales.get()};
  a.w_gate_up = {fp8(s.w_gate_up.codes), s.w_gate_up.scales.get()};
  a.activation_out = hidden_.get();
  a.gate_up_out = gate_up_.get();
  gemm::grouped_up_gate_swiglu(a, nullptr);
}

void Fp8Gemms::up_e4m3(int iter) const {
  const Set& s = sets_[set_of(iter)];
  auto a = gemm_args<gemm::Fp8UpGateSwigluArgs>();
  a.x = {fp8(s.x.codes), s.x.scales.get()};
  a.w_gate_up = {fp8(s.w_gate_up.codes), s.w_gate_up.scales.get()};
  a.activation_fp8_out = {reinterpret_cast<__nv_fp8_e4m3*>(activation_.codes.get()), activation_.scales.get()};
  a.gate_up_out = gate_up_.get();
  gemm::grouped_up_gate_swiglu(a, nullptr);
}

void Fp8Gemms::down(int iter) const {
  const Set& s = sets_[set_of(iter)];
  auto a = gemm_args<gemm::Fp8DownProjArgs>();
  a.activation = {fp8(activation_.codes), activation_.scales.get()};
  a.w_down = {fp8(s.w_down.codes), s.w_down.scales.get()};
  a.y_out = y_.get();
  gemm::grouped_down_proj(a, nullptr);
}

void Fp8Gemms::quantize_activation(int /*iter*/) const { quantize_rows_into(hidden_.get(), c_.intermediate, activation_); }

void Fp8Gemms::dgrad(int iter) const {
  const Set& s = sets_[set_of(iter)];
  auto a = gemm_args<gemm::Fp8DownDgradSwigluArgs>();
  a.dy = {fp8(s.dy.codes), s.dy.scales.get()};
  a.w_down_t = {fp8(s.w_down.codes_t), s.w_down.scales_t.get()};
  a.gate_up = saved_gate_up_;
  a.gates = gates_;
  a.d_gate_up_out = d_gate_up_.get();
  a.d_gate_up_fp8_out = {reinterpret_cast<__nv_fp8_e4m3*>(d_gate_up_fp8_.codes.get()), d_gate_up_fp8_.scales.get()};
  a.scaled_activation_out = scaled_activation_.get();
  a.d_gates_out = dg_.get();
  a.workspace = workspace_.get();
  gemm::grouped_down_dgrad_swiglu(a, nullptr);
}

void Fp8Gemms::dx(int iter) const {
  const Set& s = sets_[set_of(iter)];
  auto a = gemm_args<gemm::Fp8GateUpDgradArgs>();
  a.d_gate_up = {fp8(d_gate_up_fp8_.codes), d_gate_up_fp8_.scales.get()};
  a.w_gate_up_t = {fp8(s.w_gate_up.codes_t), s.w_gate_up.scales_t.get()};
  a.dx_out = dx_.get();
  gemm::grouped_gate_up_dgrad(a, nullptr);
}

void Fp8Gemms::quantize_wgrad_operands(int iter) const {
  const Set& s = sets_[set_of(iter)];
  const InputSet& in = inputs_[set_of(iter)];
  quantize_columns_into(in.x.get(), c_.hidden, s.x_columns);
  quantize_columns_into(in.dy.get(), c_.hidden, s.dy_columns);
  quantize_columns_into(bf16_d_gate_up_, 2 * c_.intermediate, d_gate_up_columns_);
  quantize_columns_into(bf16_scaled_activation_, c_.intermediate, scaled_activation_columns_);
}

void Fp8Gemms::wgrad(int iter, bool bf16_grads) const {
  const Set& s = sets_[set_of(iter)];
  const auto operand = [](const Rows& r) { return gemm::Fp8ColumnOperand{fp8(r.codes), r.scales.get()}; };
  gemm::Fp8WeightGradArgs a;
  a.rows = rows_;
  a.hidden = c_.hidden;
  a.intermediate = c_.intermediate;
  a.x = operand(s.x_columns);
  a.dy = operand(s.dy_columns);
  a.d_gate_up = operand(d_gate_up_columns_);
  a.scaled_activation = operand(scaled_activation_columns_);
  if (bf16_grads) {
    a.d_w_gate_up_bf16 = d_w_gate_up_bf16_.get();
    a.d_w_down_bf16 = d_w_down_bf16_.get();
  } else {
    a.d_w_gate_up = d_w_gate_up_.get();
    a.d_w_down = d_w_down_.get();
  }
  gemm::grouped_weight_grads(a, nullptr);
}

double Fp8Gemms::up_difference() const { return difference(cutlass_up_out_, gate_up_, 2 * c_.intermediate); }

double Fp8Gemms::down_difference() const { return difference(cutlass_down_out_, y_, c_.hidden); }

double Fp8Gemms::wgrad_difference() const {
  const int D = c_.hidden, I = c_.intermediate;
  return std::fmax(weight_grad_difference(cutlass_d_w_gate_up_, d_w_gate_up_.get(), c_.counts, 2 * I, D),
                   weight_grad_difference(cutlass_d_w_down_, d_w_down_.get(), c_.counts, D, I));
}

uint64_t Fp8Gemms::output_digest() const {
  uint64_t h = 0xcbf29ce484222325ull;
  const auto add = [&](const Bf16Array& a, int cols) {
    for (size_t e = 0; e < c_.counts.size(); ++e) {
      std::vector<uint16_t> bits(size_t(c_.counts[e]) * size_t(cols));
      BENCH_CUDA(cudaMemcpy(bits.data(), a.get() + size_t(offsets_[e]) * size_t(cols), bits.size() * sizeof(uint16_t),
                            cudaMemcpyDeviceToHost));
      for (const uint16_t b : bits) h = (h ^ b) * 0x100000001b3ull;
    }
  };
  add(gate_up_, 2 * c_.intermediate);
  add(hidden_, c_.intermediate);
  add(y_, c_.hidden);
  add(d_gate_up_, 2 * c_.intermediate);
  add(scaled_activation_, c_.intermediate);
  add(dx_, c_.hidden);
  return h;
}

double Fp8Gemms::difference(const Bf16Array& theirs, const Bf16Array& ours, int cols) const {
  double diff = 0.0, norm = 0.0;
  for (size_t e = 0; e < c_.counts.size(); ++e) {
    for (int r = 0; r < c_.counts[e]; r += 7) {
      const size_t first = (size_t(offsets_[e]) + size_t(r)) * size_t(cols);
      const std::vector<double> a = download_bf16(theirs.get() + first, size_t(cols));
      const std::vector<double> b = download_bf16(ours.get() + first, size_t(cols));
      for (int j = 0; j < cols; ++j) {
        diff += (a[size_t(j)] - b[size_t(j)]) * (a[size_t(j)] - b[size_t(j)]);
        norm += b[size_t(j)] * b[size_t(j)];
      }
    }
  }
  return norm > 0.0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

}  // namespace caracal::bench
