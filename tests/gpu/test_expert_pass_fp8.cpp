// Tests of the FP8 expert pass (caracal/gemm/expert_pass_fp8.hpp): its quantizations and GEMMs
// composed on the right operands. Each GEMM's accuracy is test_gpu_grouped_gemm_fp8(_backward)'s;
// here every stage is checked on what the stage before it wrote:
//   - the weights quantized in both orientations, x, the activation, dy and d_gate_up quantized:
//     bit for bit the host contract (caracal/block_fp8.hpp) of the bf16 values the pass held (the
//     activation's, which the pass does not store, from the same GEMM run again storing them);
//   - gate_up, y, d_gate/d_up, dx against the fp64 GEMMs of those dequantized operands, within the
//     FP8 GEMM tests' bounds; the weight gradients against fp64 sums of the pass's bf16 rows;
//   - bitwise determinism, and the in-place backward (d_gate_up over gate_up, dx over x) giving the
//     same bits, with the bf16 weight-gradient GEMMs and with the FP8 ones (their column copies in
//     the e4m3 rows' memory, as the layer runs them); each check shown to fail against a deliberate
//     error.
// Fresh random normal inputs, outputs poisoned first; experts of 0, 1, 64-65, 127-129 and 300 rows.
#include "caracal/gemm/expert_pass_fp8.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "caracal/bf16.hpp"
#include "caracal/block_fp8.hpp"
#include "caracal/error.hpp"
#include "gpu/fp8_test_support.hpp"
#include "gpu/gpu_test_util.hpp"
#include "gpu/grouped_gemm_test_support.hpp"

namespace {

using namespace caracal::test::gemm;
using caracal::gemm::gate_up_row;

// The weight gradients' reference sums the pass's own bf16 rows: only the summation order differs
// (test_grouped_gemm_backward.cpp measured 8e-7 for dW_down so).
constexpr double kWeightGradBound = 1e-5;

struct Rows8 {  // a pass's e4m3 rows on the device
  DeviceBuffer<uint8_t> codes;
  DeviceBuffer<float> scales;
  void allocate(size_t rows, size_t k) {
    ASSERT_NO_FATAL_FAILURE(codes.allocate(rows * k));
    ASSERT_NO_FATAL_FAILURE(scales.allocate(k / 128 * rows));
    ASSERT_NO_FATAL_FAILURE(codes.poison());
    ASSERT_NO_FATAL_FAILURE(scales.poison());
  }
  caracal::gemm::Fp8RowOutput output() const {
    return {reinterpret_cast<__nv_fp8_e4m3*>(codes.get()), scales.get()};
  }
};

struct Weights8 {  // the quantized weights: codes [count], scales zeroed first (unwritten floats stay 0)
  DeviceBuffer<uint8_t> codes, codes_t;
  DeviceBuffer<float> scales, scales_t;
  void allocate(size_t count, size_t scale_floats, size_t scale_floats_t) {
    ASSERT_NO_FATAL_FAILURE(codes.allocate(count));
    ASSERT_NO_FATAL_FAILURE(codes_t.allocate(count));
    ASSERT_NO_FATAL_FAILURE(scales.allocate(scale_floats));
    ASSERT_NO_FATAL_FAILURE(scales_t.allocate(scale_floats_t));
    ASSERT_EQ(cudaMemset(scales.get(), 0, scales.bytes()), cudaSuccess);
    ASSERT_EQ(cudaMemset(scales_t.get(), 0, scales_t.bytes()), cudaSuccess);
  }
};

__nv_fp8_e4m3* fp8(const DeviceBuffer<uint8_t>& b) { return reinterpret_cast<__nv_fp8_e4m3*>(b.get()); }

// One case: the inputs, the pass's buffers, and what it wrote.
struct Problem : ExpertInputs {
  std::vector<uint16_t> dy;  // [capacity][D]
  std::vector<float> gates;  // [capacity]
  Weights8 w_gate_up8, w_down8;  // the quantized weights
  Rows8 x8, activation8, dy8, d_gate_up8;
  DeviceBuffer<uint16_t> d_dy, gate_up, activation, out, d_gate_up, dx;
  DeviceBuffer<float> d_gates, dg, workspace, dw_gate_up, dw_down;

  caracal::gemm::Fp8ExpertWeightBuffers weight_buffers() const {
    return {fp8(w_gate_up8.codes), w_gate_up8.scales.get(), fp8(w_gate_up8.codes_t), w_gate_up8.scales_t.get(),
            fp8(w_down8.codes),    w_down8.scales.get(),    fp8(w_down8.codes_t),    w_down8.scales_t.get()};
  }
  // fp8_weight_grads: the weight gradients' column copies in the e4m3 rows' memory (the layer's).
  caracal::gemm::Fp8ExpertPass pass(bool in_place, bool fp8_weight_grads = false) const {
    caracal::gemm::Fp8ExpertPass p;
    p.rows = schedule(true);
    p.hidden = c.hidden;
    p.intermediate = c.intermediate;
    p.x = as_bf16(d_x.get());
    p.x_fp8 = x8.output();
    p.gate_up = as_bf16(gate_up.get());
    p.activation = as_bf16(activation.get());
    p.activation_fp8 = activation8.output();
    p.out = as_bf16(out.get());
    p.dy = as_bf16(d_dy.get());
    p.dy_fp8 = dy8.output();
    p.gates = d_gates.get();
    p.d_gate_up = in_place ? p.gate_up : as_bf16(d_gate_up.get());
    p.d_gate_up_fp8 = d_gate_up8.output();
    p.dg = dg.get();
    p.workspace = workspace.get();
    p.dx = in_place ? as_bf16(d_x.get()) : as_bf16(dx.get());
    if (fp8_weight_grads) {
      const auto columns = [](const caracal::gemm::Fp8RowOutput& r) {
        return caracal::gemm::Fp8ColumnOutput{r.codes, r.scales};
      };
      p.x_columns = columns(p.x_fp8);
      p.dy_columns = columns(p.dy_fp8);
      p.d_gate_up_columns = columns(p.d_gate_up_fp8);
      p.activation_columns = columns(p.activation_fp8);
    }
    return p;
  }
};

void make_problem(Problem& p, const Case& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  ASSERT_NO_FATAL_FAILURE(make_inputs(p, c, rng, Draw::kNormal));
  const size_t D = size_t(c.hidden), I = size_t(c.intermediate), L = size_t(p.num_experts);
  const size_t cap = size_t(p.rows.capacity);
  p.dy = random_rows(c.counts, p.rows, D, rng, Draw::kNormal);
  p.gates.assign(cap, 0.0f);
  std::uniform_real_distribution<float> g(0.0f, 1.0f);
  for (size_t e = 0; e < L; ++e) {
    for (int r = 0; r < c.counts[e]; ++r) p.gates[size_t(p.rows.offset[e] + r)] = g(rng);
  }
  ASSERT_NO_FATAL_FAILURE(p.d_dy.upload(p.dy));
  ASSERT_NO_FATAL_FAILURE(p.d_gates.upload(p.gates));
  const auto s = caracal::gemm::fp8_expert_weight_sizes(int(L), c.hidden, c.intermediate);
  ASSERT_NO_FATAL_FAILURE(p.w_gate_up8.allocate(s.w_gate_up_codes, s.w_gate_up_scales, s.w_gate_up_scales_t));
  ASSERT_NO_FATAL_FAILURE(p.w_down8.allocate(s.w_down_codes, s.w_down_scales, s.w_down_scales_t));
  ASSERT_NO_FATAL_FAILURE(p.x8.allocate(cap, D));
  ASSERT_NO_FATAL_FAILURE(p.activation8.allocate(cap, I));
  ASSERT_NO_FATAL_FAILURE(p.dy8.allocate(cap, D));
  ASSERT_NO_FATAL_FAILURE(p.d_gate_up8.allocate(cap, 2 * I));
  for (DeviceBuffer<uint16_t>* b : {&p.gate_up, &p.d_gate_up}) ASSERT_NO_FATAL_FAILURE(b->allocate(cap * 2 * I));
  ASSERT_NO_FATAL_FAILURE(p.activation.allocate(cap * I));
  for (DeviceBuffer<uint16_t>* b : {&p.out, &p.dx}) ASSERT_NO_FATAL_FAILURE(b->allocate(cap * D));
  ASSERT_NO_FATAL_FAILURE(p.dg.allocate(cap));
  ASSERT_NO_FATAL_FAILURE(p.workspace.allocate(caracal::gemm::fp8_down_dgrad_workspace_floats(int(cap), c.intermediate)));
  ASSERT_NO_FATAL_FAILURE(p.dw_gate_up.allocate(L * 2 * I * D));
  ASSERT_NO_FATAL_FAILURE(p.dw_down.allocate(L * D * I));
  for (DeviceBuffer<uint16_t>* b : {&p.gate_up, &p.d_gate_up, &p.activation, &p.out, &p.dx}) {
    ASSERT_NO_FATAL_FAILURE(b->poison());
  }
  for (DeviceBuffer<float>* b : {&p.dg, &p.dw_gate_up, &p.dw_down}) ASSERT_NO_FATAL_FAILURE(b->poison());
  // The rows past the last expert are the layer's zeros in the buffers the pass quantizes (the
  // GEMMs leave them untouched; the quantizers read every buffer row).
  const size_t spare = size_t(p.rows.offset.back());
  const auto zero_spare = [&](DeviceBuffer<uint16_t>& b, size_t cols) {
    ASSERT_EQ(cudaMemset(b.get() + spare * cols, 0, (cap - spare) * cols * sizeof(uint16_t)), cudaSuccess);
  };
  ASSERT_NO_FATAL_FAILURE(zero_spare(p.activation, I));
  ASSERT_NO_FATAL_FAILURE(zero_spare(p.gate_up, 2 * I));
  ASSERT_NO_FATAL_FAILURE(zero_spare(p.d_gate_up, 2 * I));
}

// What the pass wrote.
struct Outputs {
  std::vector<uint8_t> w_gate_up, w_gate_up_t, w_down, w_down_t;
  std::vector<float> w_gate_up_scales, w_gate_up_scales_t, w_down_scales, w_down_scales_t;
  std::vector<uint8_t> x8, activation8, dy8, d_gate_up8;
  std::vector<float> x8_scales, activation8_scales, dy8_scales, d_gate_up8_scales;
  std::vector<uint16_t> gate_up, activation;  // the forward's (read before the backward)
  std::vector<uint16_t> out, scaled_activation, d_gate_up, dx;
  std::vector<float> dg, dw_gate_up, dw_down;
};

// The weights quantized, the forward, then the backward, on the default stream; what they wrote.
// `x_columns_apart`: the backward's pass.x null (x's columns from its e4m3 rows) and its columns there.
void run_pass(const Problem& p, bool in_place, Outputs& o, bool fp8_weight_grads = false,
              const caracal::gemm::Fp8ColumnOutput* x_columns_apart = nullptr) {
  const caracal::gemm::ExpertPassWeights bf16_weights{as_bf16(p.d_w_gate_up.get()), as_bf16(p.d_w_down.get())};
  caracal::gemm::quantize_expert_weights(bf16_weights, p.num_experts, p.c.hidden, p.c.intermediate,
                                         p.weight_buffers(), nullptr);
  const caracal::gemm::Fp8ExpertPass pass = p.pass(in_place, fp8_weight_grads);
  const caracal::gemm::Fp8ExpertWeights weights = p.weight_buffers().operands();
  caracal::gemm::expert_forward(pass, weights, nullptr);
  // The pass stores the activation in e4m3 only: the same up/gate GEMM once more, storing it in
  // bf16 (what the e4m3 codes must quantize bit for bit).
  caracal::gemm::Fp8UpGateSwigluArgs up;
  up.rows = pass.rows;
  up.hidden = pass.hidden;
  up.intermediate = pass.intermediate;
  up.x = {pass.x_fp8.codes, pass.x_fp8.scales};
  up.w_gate_up = weights.w_gate_up;
  up.activation_out = as_bf16(p.activation.get());
  caracal::gemm::grouped_up_gate_swiglu(up, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  p.gate_up.download(o.gate_up);
  p.activation.download(o.activation);
  caracal::gemm::ExpertPassGradients grads;
  grads.w_gate_up = p.dw_gate_up.get();
  grads.w_down = p.dw_down.get();
  caracal::gemm::Fp8ExpertPass backward = pass;
  if (x_columns_apart != nullptr) {
    backward.x = nullptr;
    backward.x_columns = *x_columns_apart;
  }
  caracal::gemm::expert_backward(backward, weights, grads, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  p.w_gate_up8.codes.download(o.w_gate_up);
  p.w_gate_up8.codes_t.download(o.w_gate_up_t);
  p.w_down8.codes.download(o.w_down);
  p.w_down8.codes_t.download(o.w_down_t);
  p.w_gate_up8.scales.download(o.w_gate_up_scales);
  p.w_gate_up8.scales_t.download(o.w_gate_up_scales_t);
  p.w_down8.scales.download(o.w_down_scales);
  p.w_down8.scales_t.download(o.w_down_scales_t);
  p.x8.codes.download(o.x8);
  p.x8.scales.download(o.x8_scales);
  p.activation8.codes.download(o.activation8);
  p.activation8.scales.download(o.activation8_scales);
  p.dy8.codes.download(o.dy8);
  p.dy8.scales.download(o.dy8_scales);
  p.d_gate_up8.codes.download(o.d_gate_up8);
  p.d_gate_up8.scales.download(o.d_gate_up8_scales);
  p.out.download(o.out);
  p.activation.download(o.scaled_activation);
  (in_place ? p.gate_up : p.d_gate_up).download(o.d_gate_up);
  (in_place ? p.d_x : p.dx).download(o.dx);
  p.dg.download(o.dg);
  p.dw_gate_up.download(o.dw_gate_up);
  p.dw_down.download(o.dw_down);
}

// ---- References -----------------------------------------------------------------------------------

// The host contract's quantization of the bf16 rows `bits` ([capacity][k]).
QuantizedRows host_rows(const std::vector<uint16_t>& bits, size_t capacity, size_t k) {
  return quantize_rows_for_gemm(floats_of(bits), capacity, k);
}

// The experts' weights as the device holds them: W_gate_up [L][2I][D] interleaved, W_down [L][D][I].
std::vector<uint16_t> interleaved_gate_up(const Problem& p) {
  const size_t D = size_t(p.c.hidden), I = size_t(p.c.intermediate), L = size_t(p.num_experts);
  std::vector<uint16_t> w(L * 2 * I * D);
  caracal::gemm::interleave_gate_up_weights_host(p.w_gate.data(), p.w_up.data(), w.data(), int64_t(L), int64_t(I),
                                                 int64_t(D));
  return w;
}

// out[row][n] = sum_k a[row][k] * w[e][n][k] over each expert's real rows ([capacity][N]; 0 elsewhere).
std::vector<double> row_gemm(const Problem& p, const std::vector<double>& a, const std::vector<double>& w, size_t n,
                             size_t k) {
  std::vector<double> out(size_t(p.rows.capacity) * n, 0.0);
  for (size_t e = 0; e < size_t(p.num_experts); ++e) {
    for (size_t row = size_t(p.rows.offset[e]); row < size_t(p.rows.offset[e]) + size_t(p.c.counts[e]); ++row) {
      for (size_t j = 0; j < n; ++j) {
        const double* wr = &w[(e * n + j) * k];
        double acc = 0.0;
        for (size_t q = 0; q < k; ++q) acc += a[row * k + q] * wr[q];
        out[row * n + j] = acc;
      }
    }
  }
  return out;
}

// The reference of an output the kernels store in bf16: each value rounded as they round it.
std::vector<double> rounded(std::vector<double> v) {
  for (double& x : v) x = caracal::round_to_bf16(x);
  return v;
}

template <typename T>
size_t differing(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return std::max(a.size(), b.size());
  size_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], sizeof(T)) != 0;
  return n;
}

// The rows [0, written) of e4m3 rows that differ from `want`'s, codes ([capacity][k]) and scales
// ([k / 128][capacity]) apart: what the GEMM epilogues write (the rows below expert_offset[L]).
struct RowDifferences {
  size_t codes = 0, scales = 0;
};
RowDifferences differing_rows(const std::vector<uint8_t>& codes, const std::vector<float>& scales,
                              const QuantizedRows& want, size_t written, size_t capacity, size_t k) {
  RowDifferences d;
  for (size_t i = 0; i < written * k; ++i) d.codes += codes[i] != want.codes[i];
  for (size_t b = 0; b < k / 128; ++b) {
    for (size_t r = 0; r < written; ++r) {
      d.scales += std::memcmp(&scales[b * capacity + r], &want.scales[b * capacity + r], sizeof(float)) != 0;
    }
  }
  return d;
}

// One expert's fp32 gradient against the fp64 one: the relative Frobenius error.
double gradient_error(const float* got, const double* want, size_t count) {
  double err2 = 0.0, ref2 = 0.0;
  for (size_t i = 0; i < count; ++i) {
    const double v = double(got[i]);
    err2 += std::isnan(v) ? INFINITY : (v - want[i]) * (v - want[i]);
    ref2 += want[i] * want[i];
  }
  return ref2 > 0.0 ? std::sqrt(err2 / ref2) : std::sqrt(err2);
}

// Everything the pass wrote, against the references of its own stages (the file's head says which);
// what is wrong, one line each (empty: nothing).
std::vector<std::string> pass_failures(const Problem& p, const Outputs& o) {
  const size_t D = size_t(p.c.hidden), I = size_t(p.c.intermediate), L = size_t(p.num_experts);
  const size_t cap = size_t(p.rows.capacity);
  std::vector<std::string> f;
  const auto same = [&](const char* what, size_t n) {
    if (n != 0) f.push_back(std::string(what) + ": " + std::to_string(n) + " values differ from the host contract");
  };
  const auto close = [&](const char* what, size_t cols, const std::vector<double>& ref, const std::vector<uint16_t>& out,
                         const caracal::test::ErrorBound& bound) {
    for (const std::string& m : close_failures(what, p.rows, p.c.counts, cols, ref, out, bound, false)) f.push_back(m);
  };

  // The weights, both orientations.
  const std::vector<float> w_gate_up = floats_of(interleaved_gate_up(p)), w_down = floats_of(p.w_down);
  const QuantizedWeights gu = quantize_weights_for_gemm(w_gate_up, L, 2 * I, D);
  const QuantizedWeights gu_t = quantize_weights_for_gemm(transposed(w_gate_up, L, 2 * I, D), L, D, 2 * I);
  const QuantizedWeights dn = quantize_weights_for_gemm(w_down, L, D, I);
  const QuantizedWeights dn_t = quantize_weights_for_gemm(transposed(w_down, L, D, I), L, I, D);
  same("W_gate_up codes", differing(o.w_gate_up, gu.codes));
  same("W_gate_up scales", differing(o.w_gate_up_scales, gu.scales));
  same("W_gate_up^T codes", differing(o.w_gate_up_t, gu_t.codes));
  same("W_gate_up^T scales", differing(o.w_gate_up_scales_t, gu_t.scales));
  same("W_down codes", differing(o.w_down, dn.codes));
  same("W_down scales", differing(o.w_down_scales, dn.scales));
  same("W_down^T codes", differing(o.w_down_t, dn_t.codes));
  same("W_down^T scales", differing(o.w_down_scales_t, dn_t.scales));

  // Forward: x quantized, gate_up, the activation quantized, y.
  const QuantizedRows x8 = host_rows(p.x, cap, D);
  same("x codes", differing(o.x8, x8.codes));
  same("x scales", differing(o.x8_scales, x8.scales));
  close("gate_up", 2 * I, rounded(row_gemm(p, x8.values, gu.values, 2 * I, D)), o.gate_up, kFp8GateUpBound);
  // The up/gate epilogue writes the e4m3 activation of the rows below expert_offset[L] only (the
  // quantizers: every buffer row), as the dgrad's d_gate_up below.
  const size_t written = size_t(p.rows.offset.back());
  const QuantizedRows act8 = host_rows(o.activation, cap, I);
  const RowDifferences act8_diff = differing_rows(o.activation8, o.activation8_scales, act8, written, cap, I);
  same("activation codes", act8_diff.codes);
  same("activation scales", act8_diff.scales);
  close("y", D, rounded(row_gemm(p, act8.values, dn.values, D, I)), o.out, kFp8DownBound);

  // Backward: dy quantized, d_gate / d_up from d_h = dy · W_down (the dgrad's operands), d_gate_up
  // quantized, dx, the weight gradients.
  const QuantizedRows dy8 = host_rows(p.dy, cap, D);
  same("dy codes", differing(o.dy8, dy8.codes));
  same("dy scales", differing(o.dy8_scales, dy8.scales));
  const std::vector<double> d_h = row_gemm(p, dy8.values, dn_t.values, I, D);  // W_down^T [L][I][D]
  std::vector<double> d_gate_up(cap * 2 * I, 0.0);
  const std::vector<double> gate_up = widen(o.gate_up);
  for (size_t e = 0; e < L; ++e) {
    for (size_t row = size_t(p.rows.offset[e]); row < size_t(p.rows.offset[e]) + size_t(p.c.counts[e]); ++row) {
      for (size_t j = 0; j < I; ++j) {
        const size_t gc = size_t(gate_up_row(int64_t(j), false)), uc = size_t(gate_up_row(int64_t(j), true));
        const double gate = gate_up[row * 2 * I + gc], up = gate_up[row * 2 * I + uc];
        const double d_act = double(p.gates[row]) * d_h[row * I + j];
        d_gate_up[row * 2 * I + gc] = d_act * up * silu_grad(gate);
        d_gate_up[row * 2 * I + uc] = d_act * silu(gate);
      }
    }
  }
  close("d_gate_up", 2 * I, rounded(d_gate_up), o.d_gate_up, kFp8DgradBound);
  const QuantizedRows dgu8 = host_rows(o.d_gate_up, cap, 2 * I);
  const RowDifferences dgu8_diff = differing_rows(o.d_gate_up8, o.d_gate_up8_scales, dgu8, written, cap, 2 * I);
  same("d_gate_up codes", dgu8_diff.codes);
  same("d_gate_up scales", dgu8_diff.scales);
  close("dx", D, rounded(row_gemm(p, dgu8.values, gu_t.values, D, 2 * I)), o.dx, kFp8DxBound);

  // dW_gate_up[e][n][d] = sum_rows d_gate_up[row][n] x[row][d]; dW_down[e][d][i] = sum_rows dy[row][d]
  // bf16(g · act)[row][i]; the pass's own bf16 rows.
  const std::vector<double> x = widen(p.x), dy = widen(p.dy), dgu = widen(o.d_gate_up),
                            sa = widen(o.scaled_activation);
  for (size_t e = 0; e < L; ++e) {
    const size_t begin = size_t(p.rows.offset[e]), end = begin + size_t(p.c.counts[e]);
    std::vector<double> want_gu(2 * I * D, 0.0), want_dn(D * I, 0.0);
    for (size_t row = begin; row < end; ++row) {
      for (size_t n = 0; n < 2 * I; ++n) {
        for (size_t d = 0; d < D; ++d) want_gu[n * D + d] += dgu[row * 2 * I + n] * x[row * D + d];
      }
      for (size_t d = 0; d < D; ++d) {
        for (size_t i = 0; i < I; ++i) want_dn[d * I + i] += dy[row * D + d] * sa[row * I + i];
      }
    }
    const double egu = gradient_error(&o.dw_gate_up[e * 2 * I * D], want_gu.data(), want_gu.size());
    const double edn = gradient_error(&o.dw_down[e * D * I], want_dn.data(), want_dn.size());
    if (!(egu <= kWeightGradBound)) f.push_back("dW_gate_up of expert " + std::to_string(e) + ": " + std::to_string(egu));
    if (!(edn <= kWeightGradBound)) f.push_back("dW_down of expert " + std::to_string(e) + ": " + std::to_string(edn));
  }
  return f;
}

// ---- Tests --------------------------------------------------------------------------------------------

const Case kPassCase{"pass", 256, 128, kEdgeCounts};

TEST(GpuExpertPassFp8, EveryStageOnTheRightOperands) {
  CARACAL_REQUIRE_GPU();
  Problem p;
  ASSERT_NO_FATAL_FAILURE(make_problem(p, kPassCase, p.seed.value()));
  Outputs o;
  ASSERT_NO_FATAL_FAILURE(run_pass(p, false, o));
  for (const std::string& m : pass_failures(p, o)) ADD_FAILURE() << m;
  expect_padding("y", p.rows, p.c.counts, size_t(p.c.hidden), o.out);
  expect_padding("dx", p.rows, p.c.counts, size_t(p.c.hidden), o.dx);
}

// The pass run in place (d_gate_up over gate_up, dx over x; x re-uploaded after, the pass overwrote
// it) gives `first`'s bits: dx's rows below expert_offset[L] (past it, x's zeros stay where dx's
// buffer kept its poison), d_gate_up and both weight gradients.
void expect_in_place_bits(Problem& p, const Outputs& first, bool fp8_weight_grads) {
  Outputs in_place;
  ASSERT_NO_FATAL_FAILURE(run_pass(p, true, in_place, fp8_weight_grads));
  ASSERT_NO_FATAL_FAILURE(p.d_x.upload(p.x));
  const size_t dx_rows = size_t(p.rows.offset.back()) * size_t(p.c.hidden);
  EXPECT_EQ(differing(std::vector<uint16_t>(first.dx.begin(), first.dx.begin() + ptrdiff_t(dx_rows)),
                      std::vector<uint16_t>(in_place.dx.begin(), in_place.dx.begin() + ptrdiff_t(dx_rows))),
            0u)
      << "dx written over x";
  EXPECT_EQ(differing(first.d_gate_up, in_place.d_gate_up), 0u) << "d_gate_up written over gate_up";
  EXPECT_EQ(differing(first.dw_gate_up, in_place.dw_gate_up), 0u) << "dW_gate_up in place";
  EXPECT_EQ(differing(first.dw_down, in_place.dw_down), 0u) << "dW_down in place";
}

TEST(GpuExpertPassFp8, BitwiseRepeatableAndInPlace) {
  CARACAL_REQUIRE_GPU();
  Problem p;
  ASSERT_NO_FATAL_FAILURE(make_problem(p, kPassCase, p.seed.value()));
  Outputs first, second;
  ASSERT_NO_FATAL_FAILURE(run_pass(p, false, first));
  ASSERT_NO_FATAL_FAILURE(run_pass(p, false, second));
  EXPECT_EQ(differing(first.out, second.out), 0u) << "y";
  EXPECT_EQ(differing(first.dx, second.dx), 0u) << "dx";
  EXPECT_EQ(differing(first.d_gate_up, second.d_gate_up), 0u) << "d_gate_up";
  EXPECT_EQ(differing(first.dg, second.dg), 0u) << "dg";
  EXPECT_EQ(differing(first.dw_gate_up, second.dw_gate_up), 0u) << "dW_gate_up";
  EXPECT_EQ(differing(first.dw_down, second.dw_down), 0u) << "dW_down";
  ASSERT_NO_FATAL_FAILURE(expect_in_place_bits(p, first, false));
}

// The FP8 weight gradients, their column copies in the e4m3 rows' memory: bitwise repeatable, the
// same bits in place (x is quantized down its columns before dx overwrites it), every other output
// the bf16 GEMMs' bits, the gradients within what quantizing their operands costs of the bf16 GEMMs'.
// The relative Frobenius difference of `got` from `want` (test::OutputError's; a NaN counts as
// unwritten: infinity here).
double relative_difference(const std::vector<float>& got, const std::vector<float>& want) {
  caracal::test::OutputError e("difference");
  caracal::checks::add_rows(e, [&](size_t i) { return double(got[i]); }, std::vector<double>(want.begin(), want.end()),
                            1, want.size());
  return e.unwritten() != 0 ? INFINITY : e.frobenius();
}

TEST(GpuExpertPassFp8, Fp8WeightGradientsRepeatableAndInPlace) {
  CARACAL_REQUIRE_GPU();
  Problem p;
  ASSERT_NO_FATAL_FAILURE(make_problem(p, kPassCase, p.seed.value()));
  Outputs bf16, first, second;
  ASSERT_NO_FATAL_FAILURE(run_pass(p, false, bf16));
  ASSERT_NO_FATAL_FAILURE(run_pass(p, false, first, true));
  ASSERT_NO_FATAL_FAILURE(run_pass(p, false, second, true));
  EXPECT_EQ(differing(first.dw_gate_up, second.dw_gate_up), 0u) << "dW_gate_up";
  EXPECT_EQ(differing(first.dw_down, second.dw_down), 0u) << "dW_down";
  EXPECT_EQ(differing(first.dx, bf16.dx), 0u) << "dx";
  EXPECT_EQ(differing(first.d_gate_up, bf16.d_gate_up), 0u) << "d_gate_up";
  EXPECT_EQ(differing(first.dg, bf16.dg), 0u) << "dg";
  ASSERT_EQ(first.dw_gate_up.size(), bf16.dw_gate_up.size());
  ASSERT_EQ(first.dw_down.size(), bf16.dw_down.size());
  const double gate_up = relative_difference(first.dw_gate_up, bf16.dw_gate_up);
  const double down = relative_difference(first.dw_down, bf16.dw_down);
  std::cout << "  FP8 weight gradients over the bf16 GEMMs': dW_gate_up " << gate_up << ", dW_down " << down << "\n";
  EXPECT_GT(gate_up, 0.0) << "the FP8 weight gradients are the bf16 GEMMs' bits: FP8 did not run";
  EXPECT_LT(gate_up, 0.1);
  EXPECT_LT(down, 0.1);
  ASSERT_NO_FATAL_FAILURE(expect_in_place_bits(p, first, true));
}

// DeepSeek-V3's requantization (pass.x null): x's columns from its e4m3 rows, dequantized. dW_down
// (no x in it) and every other output the same bits; dW_gate_up apart from the bf16 rows' columns by
// what the second rounding of x costs (a few percent at most), and the same bits run to run.
TEST(GpuExpertPassFp8, Fp8WeightGradientsFromTheE4m3Rows) {
  CARACAL_REQUIRE_GPU();
  Problem p;
  ASSERT_NO_FATAL_FAILURE(make_problem(p, kPassCase, p.seed.value()));
  const size_t D = size_t(p.c.hidden), cap = size_t(p.rows.capacity);
  DeviceBuffer<uint8_t> codes;
  DeviceBuffer<float> scales;
  ASSERT_NO_FATAL_FAILURE(codes.allocate(D * cap));
  ASSERT_NO_FATAL_FAILURE(scales.allocate(D * cap / 128));
  const caracal::gemm::Fp8ColumnOutput apart{reinterpret_cast<__nv_fp8_e4m3*>(codes.get()), scales.get()};
  Outputs rows, first, second;
  ASSERT_NO_FATAL_FAILURE(run_pass(p, false, rows, true));
  ASSERT_NO_FATAL_FAILURE(run_pass(p, false, first, true, &apart));
  ASSERT_NO_FATAL_FAILURE(run_pass(p, false, second, true, &apart));
  EXPECT_EQ(differing(first.dw_gate_up, second.dw_gate_up), 0u) << "dW_gate_up run to run";
  EXPECT_EQ(differing(first.dw_down, rows.dw_down), 0u) << "dW_down";
  EXPECT_EQ(differing(first.dx, rows.dx), 0u) << "dx";
  EXPECT_EQ(differing(first.dg, rows.dg), 0u) << "dg";
  const double gate_up = relative_difference(first.dw_gate_up, rows.dw_gate_up);
  std::cout << "  dW_gate_up from x's e4m3 rows over from its bf16 rows: " << gate_up << "\n";
  EXPECT_GT(gate_up, 0.0) << "x's columns came from its bf16 rows";
  EXPECT_LT(gate_up, 0.05);
}

// The checks can fail: a y, a dx and a quantized activation each off by a little are caught.
TEST(GpuExpertPassFp8, CatchDeliberateErrors) {
  CARACAL_REQUIRE_GPU();
  Problem p;
  ASSERT_NO_FATAL_FAILURE(make_problem(p, kPassCase, p.seed.value()));
  Outputs o;
  ASSERT_NO_FATAL_FAILURE(run_pass(p, false, o));
  ASSERT_EQ(pass_failures(p, o), std::vector<std::string>{}) << "the real outputs pass";
  const size_t D = size_t(p.c.hidden), big = size_t(p.rows.offset[7]);  // expert 7: 300 rows
  Outputs y_off = o;
  y_off.out = scaled_rows(o.out, big, 300, D, 1.005f);
  EXPECT_NE(pass_failures(p, y_off), std::vector<std::string>{}) << "y 0.5% off passed";
  Outputs dx_off = o;
  dx_off.dx = scaled_rows(o.dx, big, 300, D, 1.005f);
  EXPECT_NE(pass_failures(p, dx_off), std::vector<std::string>{}) << "dx 0.5% off passed";
  Outputs code_off = o;
  code_off.activation8[size_t(p.rows.offset[7]) * size_t(p.c.intermediate)] ^= 1;
  EXPECT_NE(pass_failures(p, code_off), std::vector<std::string>{}) << "an activation code off passed";
  Outputs grad_off = o;
  for (size_t i = 0; i < D; ++i) grad_off.dw_down[7 * D * size_t(p.c.intermediate) + i] *= 1.001f;
  EXPECT_NE(pass_failures(p, grad_off), std::vector<std::string>{}) << "dW_down 0.1% off passed";
}

// Host-side: the weights in Hugging Face's [gate; up] halves are refused by name.
TEST(ExpertPassFp8Host, RefusesTheHalvesLayout) {
  caracal::gemm::ExpertPassWeights w{fake_ptr<const __nv_bfloat16>(), fake_ptr<const __nv_bfloat16>(),
                                     caracal::gemm::GateUpLayout::kHalves};
  caracal::gemm::Fp8ExpertWeightBuffers out;
  try {
    caracal::gemm::quantize_expert_weights(w, 4, 256, 128, out, nullptr);
    ADD_FAILURE() << "the halves layout was taken";
  } catch (const caracal::Error& e) {
    EXPECT_NE(std::string(e.what()).find("w_gate_up_layout"), std::string::npos) << e.what();
  }
}

// FP8 weight gradients: all four column outputs or none, over the whole schedule; refused by name
// before anything is enqueued (the fake pointers are never read).
TEST(ExpertPassFp8Host, Fp8WeightGradientArgumentsAreCheckedFirst) {
  caracal::gemm::Fp8ExpertPass pass;
  pass.rows = fake_rows();
  pass.hidden = 256;
  pass.intermediate = 128;
  const caracal::gemm::Fp8ColumnOutput some{fake_ptr<__nv_fp8_e4m3>(), fake_ptr<float>(1 << 12)};
  pass.x_columns = pass.dy_columns = pass.activation_columns = some;
  caracal::gemm::ExpertPassGradients grads;
  const auto backward = [&] {
    return [&] { caracal::gemm::expert_backward(pass, caracal::gemm::Fp8ExpertWeights{}, grads, nullptr); };
  };
  expect_error(backward(), {"expert_backward (fp8)", "all four column outputs or none",
                            "pass.d_gate_up_columns.codes_t and pass.d_gate_up_columns.scales must not be null"});
  pass.d_gate_up_columns = some;
  pass.activation_columns.scales = nullptr;
  expect_error(backward(), {"pass.activation_columns.scales must not be null"});
  pass.activation_columns = some;
  pass.rows.ring_rows = 512;
  expect_error(backward(), {"whole schedule", "ring_rows, first_row and end_row must be 0", "512"});
  pass.rows.ring_rows = 0;
  float partial = 0.0f;
  grads.partial_in = &partial;
  expect_error(backward(), {"whole schedule", "grads.partial_in and grads.partial_out must be null"});
}

TEST(ExpertPassFp8Host, WeightSizes) {
  const auto s = caracal::gemm::fp8_expert_weight_sizes(3, 256, 384);
  EXPECT_EQ(s.w_gate_up_codes, 3u * 768 * 256);
  EXPECT_EQ(s.w_down_codes, 3u * 256 * 384);
  // Scale rows: blocks of N at a 4-float step, rounded up to 32 floats.
  EXPECT_EQ(s.w_gate_up_scales, 3u * 2 * 32);    // K = 256: 2 blocks; N = 768: 6 blocks, a row of 32
  EXPECT_EQ(s.w_gate_up_scales_t, 3u * 6 * 32);  // K = 768: 6 blocks; N = 256
  EXPECT_EQ(s.w_down_scales, 3u * 3 * 32);       // K = 384: 3 blocks
  EXPECT_EQ(s.w_down_scales_t, 3u * 2 * 32);
}

}  // namespace
