#include "gemm_bench_run.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "caracal/gemm/grouped_gemm.hpp"
#include "caracal/gemm/grouped_gemm_backward.hpp"
#include "cublas_gemm.hpp"
#include "gemm_bench_cutlass.hpp"
#include "gemm_bench_fp8.hpp"
#include "device_random.cuh"
#include "event_timer.hpp"
#include "gemm_spot_checks.hpp"

namespace caracal::bench {

namespace {

using gemm::DownDgradSwigluArgs;
using gemm::DownProjArgs;
using gemm::GateUpDgradArgs;
using gemm::UpGateSwigluArgs;
using gemm::WeightGradArgs;

// ---- Inputs -------------------------------------------------------------------------------------

// Uniform in [-scale, scale], on the legacy stream.
void fill_symmetric(__nv_bfloat16* out, size_t n, uint64_t seed, float scale) {
  bench::fill_uniform(out, n, seed, -scale, scale, nullptr);
}

// One, or as many as keep four L2s' worth of distinct inputs in rotation (at most 8).
int input_set_count(const Case& c, size_t capacity, size_t l2_bytes) {
  const size_t D = size_t(c.hidden), I = size_t(c.intermediate), L = size_t(c.num_experts);
  const size_t set_bytes = 2 * (2 * capacity * D + L * 2 * I * D + L * D * I);
  return int(std::min<size_t>(8, std::max<size_t>(1, (4 * l2_bytes + set_bytes - 1) / set_bytes)));
}

// Input set `s`: x and dy in [-1, 1], the weights in +-sqrt(3/K) for a GEMM over K (outputs of the
// inputs' scale); padding rows hold zeros, as the transfers leave them.
void fill_input_set(InputSet& set, const Case& c, const std::vector<int32_t>& offsets, uint64_t seed, int s) {
  const size_t D = size_t(c.hidden), I = size_t(c.intermediate), L = size_t(c.num_experts);
  const size_t capacity = size_t(offsets.back());
  const uint64_t set_seed = seed + 100 * uint64_t(s);
  set.x.resize(capacity * D);
  set.dy.resize(capacity * D);
  set.w_gate_up.resize(L * 2 * I * D);
  set.w_down.resize(L * D * I);
  fill_symmetric(set.x.get(), capacity * D, set_seed + 1, 1.0f);
  fill_symmetric(set.w_gate_up.get(), L * 2 * I * D, set_seed + 2, float(std::sqrt(3.0 / double(D))));
  fill_symmetric(set.w_down.get(), L * D * I, set_seed + 3, float(std::sqrt(3.0 / double(I))));
  fill_symmetric(set.dy.get(), capacity * D, set_seed + 4, 1.0f);
  for (size_t e = 0; e < L; ++e) {
    const size_t first_pad = size_t(offsets[e]) + size_t(c.counts[e]);
    const size_t pad_bytes = (size_t(offsets[e + 1]) - first_pad) * D * 2;
    BENCH_CUDA(cudaMemset(set.x.get() + first_pad * D, 0, pad_bytes));
    BENCH_CUDA(cudaMemset(set.dy.get() + first_pad * D, 0, pad_bytes));
  }
}

std::vector<InputSet> make_input_sets(const Case& c, const std::vector<int32_t>& offsets, uint64_t seed,
                                      size_t l2_bytes) {
  std::vector<InputSet> in(size_t(input_set_count(c, size_t(offsets.back()), l2_bytes)));
  for (size_t s = 0; s < in.size(); ++s) fill_input_set(in[s], c, offsets, seed, int(s));
  return in;
}

// ---- Our kernels --------------------------------------------------------------------------------

// One of our kernels' argument structs with the case's rows and shape (num_ctas 0: one per SM).
template <typename Args>
Args case_args(const ScheduleView& rows, const Case& c) {
  Args a;
  a.rows = rows;
  a.hidden = c.hidden;
  a.intermediate = c.intermediate;
  return a;
}

// The buffers our kernels write for one case, and one launch of each on input set iter % sets.
struct OurKernels {
  OurKernels(const Case& the_case, const std::vector<int32_t>& offsets, const std::vector<InputSet>& input_sets,
             uint64_t seed);

  // `queued` false: the tiles in the fixed-stride order instead of from the tile queue.
  void up(int iter, bool store_gate_up, bool queued = true) const {
    const InputSet& s = set(iter);
    auto a = case_args<UpGateSwigluArgs>(rows, c);
    a.tile_queue = queued ? tile_queue.get() : nullptr;
    a.x = s.x.get();
    a.w_gate_up = s.w_gate_up.get();
    a.activation_out = hidden.get();
    a.gate_up_out = store_gate_up ? gate_up.get() : nullptr;
    gemm::grouped_up_gate_swiglu(a, nullptr);
  }
  void down(int iter, bool queued = true) const {
    auto a = case_args<DownProjArgs>(rows, c);
    a.tile_queue = queued ? tile_queue.get() : nullptr;
    a.activation = hidden.get();
    a.w_down = set(iter).w_down.get();
    a.y_out = y.get();
    gemm::grouped_down_proj(a, nullptr);
  }
  void dgrad(int iter, bool queued = true) const {
    const InputSet& s = set(iter);
    auto a = case_args<DownDgradSwigluArgs>(rows, c);
    a.tile_queue = queued ? tile_queue.get() : nullptr;
    a.dy = s.dy.get();
    a.w_down = s.w_down.get();
    a.gate_up = gate_up.get();
    a.gates = gates.get();
    a.d_gate_up_out = d_gate_up.get();
    a.scaled_activation_out = scaled_activation.get();
    a.d_gates_out = dg.get();
    a.workspace = workspace.get();
    gemm::grouped_down_dgrad_swiglu(a, nullptr);
  }
  void dgrad_x(int iter, bool queued = true) const {
    auto a = case_args<GateUpDgradArgs>(rows, c);
    a.tile_queue = queued ? tile_queue.get() : nullptr;
    a.d_gate_up = d_gate_up.get();
    a.w_gate_up = set(iter).w_gate_up.get();
    a.dx_out = dx.get();
    gemm::grouped_gate_up_dgrad(a, nullptr);
  }
  void wgrad(int iter, bool bf16_grads) const {
    const InputSet& s = set(iter);
    auto a = case_args<WeightGradArgs>(rows, c);
    a.x = s.x.get();
    a.dy = s.dy.get();
    a.d_gate_up = d_gate_up.get();
    a.scaled_activation = scaled_activation.get();
    if (bf16_grads) {
      a.d_w_gate_up_bf16 = d_w_gate_up_bf16.get();
      a.d_w_down_bf16 = d_w_down_bf16.get();
    } else {
      a.d_w_gate_up = d_w_gate_up.get();
      a.d_w_down = d_w_down.get();
    }
    gemm::grouped_weight_grads(a, nullptr);
  }
  const InputSet& set(int iter) const { return inputs[size_t(iter % int(inputs.size()))]; }

  const Case& c;
  const std::vector<InputSet>& inputs;
  DeviceArray<int32_t> d_offsets, d_counts;
  ScheduleView rows;
  std::vector<float> gates_host;  // g per row, 0 on padding rows
  DeviceArray<float> gates;
  Bf16Array hidden, gate_up, y, d_gate_up, scaled_activation, dx;
  DeviceArray<float> dg, workspace, d_w_gate_up, d_w_down;
  DeviceArray<__nv_bfloat16> d_w_gate_up_bf16, d_w_down_bf16;
  DeviceArray<uint32_t> tile_queue;
};

OurKernels::OurKernels(const Case& the_case, const std::vector<int32_t>& offsets,
                       const std::vector<InputSet>& input_sets, uint64_t seed)
    : c(the_case), inputs(input_sets), d_offsets(offsets.size()), d_counts(size_t(the_case.num_experts)),
      gates_host(padded_row_gates(the_case.counts, seed)), tile_queue(size_t(gemm::kTileQueueWords)) {
  const size_t D = size_t(c.hidden), I = size_t(c.intermediate), L = size_t(c.num_experts);
  const size_t cap = size_t(offsets.back());
  hidden.resize(cap * I);
  gate_up.resize(cap * 2 * I);
  y.resize(cap * D);
  d_gate_up.resize(cap * 2 * I);
  scaled_activation.resize(cap * I);
  dx.resize(cap * D);
  gates.resize(cap);
  dg.resize(cap);
  workspace.resize(gemm::down_dgrad_workspace_floats(int(cap), int(I)));
  d_w_gate_up.resize(L * 2 * I * D);
  d_w_down.resize(L * D * I);
  d_w_gate_up_bf16.resize(L * 2 * I * D);
  d_w_down_bf16.resize(L * D * I);
  BENCH_CUDA(cudaMemcpy(d_offsets.get(), offsets.data(), offsets.size() * 4, cudaMemcpyHostToDevice));
  const std::vector<int32_t> counts32(c.counts.begin(), c.counts.end());
  BENCH_CUDA(cudaMemcpy(d_counts.get(), counts32.data(), L * 4, cudaMemcpyHostToDevice));
  BENCH_CUDA(cudaMemcpy(gates.get(), gates_host.data(), cap * 4, cudaMemcpyHostToDevice));
  rows = {d_offsets.get(), d_counts.get(), int(L), int(cap)};
}

// ---- cuBLAS -------------------------------------------------------------------------------------

// cuBLAS dense GEMMs of our kernels' shapes over the case's real rows with the same operand layouts
// (the backward's with one expert's weights; the weight gradients with fp32 output, as ours).
class DenseGemms {
 public:
  DenseGemms(const OurKernels& ours, cublasHandle_t cublas)
      : ours_(ours), cublas_(cublas), rows_(int(ours.c.rows())), i_(ours.c.intermediate), d_(ours.c.hidden),
        out_(std::max<size_t>(1, size_t(rows_) * std::max(2 * size_t(i_), size_t(d_)))),
        grad_(2 * size_t(i_) * size_t(d_)) {}

  void up(int iter) const {
    const InputSet& s = ours_.set(iter);
    cublas_gemm(cublas_, s.x.get(), true, s.w_gate_up.get(), true, out_.get(), CUDA_R_16BF, rows_, 2 * i_, d_);
  }
  void down(int iter) const {
    cublas_gemm(cublas_, ours_.hidden.get(), true, ours_.set(iter).w_down.get(), true, out_.get(), CUDA_R_16BF, rows_,
                d_, i_);
  }
  void dgrad(int iter) const {
    const InputSet& s = ours_.set(iter);
    cublas_gemm(cublas_, s.dy.get(), true, s.w_down.get(), false, out_.get(), CUDA_R_16BF, rows_, i_, d_);
  }
  void dx(int iter) const {
    cublas_gemm(cublas_, ours_.d_gate_up.get(), true, ours_.set(iter).w_gate_up.get(), false, out_.get(), CUDA_R_16BF,
                rows_, d_, 2 * i_);
  }
  void wgrad(int iter) const {
    const InputSet& s = ours_.set(iter);
    cublas_gemm(cublas_, ours_.d_gate_up.get(), false, s.x.get(), false, grad_.get(), CUDA_R_32F, 2 * i_, d_, rows_);
    cublas_gemm(cublas_, s.dy.get(), false, ours_.scaled_activation.get(), false, grad_.get(), CUDA_R_32F, d_, i_,
                rows_);
  }

 private:
  const OurKernels& ours_;
  cublasHandle_t cublas_;
  int rows_, i_, d_;
  Bf16Array out_;
  DeviceArray<float> grad_;
};

// ---- Timing -------------------------------------------------------------------------------------

// The FLOPs of each kernel over the real rows; the backward's are twice the forward's.
struct Flops {
  explicit Flops(const Case& c) {
    const double rows = double(c.rows()), D = double(c.hidden), I = double(c.intermediate);
    up = 2.0 * rows * D * (2 * I);
    down = 2.0 * rows * I * D;
    forward = up + down;
    dgrad = down;    // dy · W_down
    dx = up;         // d_gate_up · W_gate_up
    wgrad = forward;  // d_gate_up^T x and dy^T hidden
    backward = dgrad + dx + wgrad;
  }
  double up, down, forward, dgrad, dx, wgrad, backward;
};

Timing make_timing(const RunTimes& times, double useful_flops, double padded_flops) {
  Timing t;
  const double ms = times.median_ms;
  t.ms = ms;
  t.min_ms = times.min_ms;
  t.max_ms = times.max_ms;
  t.tflops = useful_flops / (ms * 1e-3) / 1e12;
  t.tflops_padded = padded_flops / (ms * 1e-3) / 1e12;
  return t;
}

// Registers run(iteration) to be timed under `name`: useful FLOPs, and what the kernels execute.
using TimeIt = std::function<void(const char* name, const std::function<void(int)>& run, double flops,
                                  double padded_flops)>;

struct TimedKernel {
  std::string name;
  std::function<void(int)> run;
  double flops, padded_flops;
  std::vector<double> ms;  // every timed run, over all rounds
};

// Times every kernel in kRounds rounds, each round giving each kernel its share of the `reps` runs
// in turn, so that no kernel is measured only early or only late in the case (clocks, L2 and power
// drift between the first kernels and the last: one kernel's time can move by a quarter with its
// place in the order). The first round warms each kernel up fully, the
// later ones briefly.
constexpr int kRounds = 4;

void time_in_rounds(std::vector<TimedKernel>& kernels, int warmup, int reps, std::map<std::string, Timing>& out) {
  const int per_round = std::max(1, (reps + kRounds - 1) / kRounds);
  for (int round = 0; round < kRounds; ++round) {
    for (TimedKernel& k : kernels) {
      const int first_iteration = round * 100000;  // any start: the runs rotate over the input sets
      const std::vector<double> ms = round == 0 ? time_samples(nullptr, warmup, per_round, k.run, 200.0, first_iteration)
                                                : time_samples(nullptr, 2, per_round, k.run, 20.0, first_iteration);
      k.ms.insert(k.ms.end(), ms.begin(), ms.end());
    }
  }
  for (const TimedKernel& k : kernels) out[k.name] = make_timing(summarize(k.ms), k.flops, k.padded_flops);
}

// `pad`: padded rows over real rows.
void time_ours(const OurKernels& k, const Flops& f, double pad, const TimeIt& time_it) {
  time_it("up_gate_swiglu", [&](int i) { k.up(i, true); }, f.up, f.up * pad);
  time_it("up_gate_swiglu_hidden_only", [&](int i) { k.up(i, false); }, f.up, f.up * pad);
  time_it("down", [&](int i) { k.down(i); }, f.down, f.down * pad);
  // The same kernels with each CTA's tiles at a fixed stride (no tile queue), the order before it.
  time_it("up_gate_swiglu_hidden_only_fixed_stride", [&](int i) { k.up(i, false, false); }, f.up, f.up * pad);
  time_it("down_fixed_stride", [&](int i) { k.down(i, false); }, f.down, f.down * pad);
  time_it("dgrad_swiglu_fixed_stride", [&](int i) { k.dgrad(i, false); }, f.dgrad, f.dgrad * pad);
  time_it("dx_fixed_stride", [&](int i) { k.dgrad_x(i, false); }, f.dx, f.dx * pad);
  time_it("forward", [&](int i) { k.up(i, true); k.down(i); }, f.forward, f.forward * pad);
  // The backward reads the gate_up of the last forward; its inputs do not change its speed.
  time_it("dgrad_swiglu", [&](int i) { k.dgrad(i); }, f.dgrad, f.dgrad * pad);
  time_it("dx", [&](int i) { k.dgrad_x(i); }, f.dx, f.dx * pad);
  time_it("wgrad", [&](int i) { k.wgrad(i, false); }, f.wgrad, f.wgrad * pad);
  time_it("wgrad_bf16", [&](int i) { k.wgrad(i, true); }, f.wgrad, f.wgrad * pad);
  time_it("backward", [&](int i) { k.dgrad(i); k.dgrad_x(i); k.wgrad(i, false); }, f.backward, f.backward * pad);
}

void time_dense(const DenseGemms& g, const Flops& f, const TimeIt& time_it) {
  time_it("cublas_up", [&](int i) { g.up(i); }, f.up, f.up);
  time_it("cublas_down", [&](int i) { g.down(i); }, f.down, f.down);
  time_it("cublas_forward", [&](int i) { g.up(i); g.down(i); }, f.forward, f.forward);
  time_it("cublas_dgrad", [&](int i) { g.dgrad(i); }, f.dgrad, f.dgrad);
  time_it("cublas_dx", [&](int i) { g.dx(i); }, f.dx, f.dx);
  time_it("cublas_wgrad", [&](int i) { g.wgrad(i); }, f.wgrad, f.wgrad);
  time_it("cublas_backward", [&](int i) { g.dgrad(i); g.dx(i); g.wgrad(i); }, f.backward, f.backward);
}

void time_cutlass(const CutlassBaseline& g, const Flops& f, const TimeIt& time_it) {
  for (CutlassSchedule schedule : kCutlassSchedules) {
    const std::string name = std::string("cutlass_") + cutlass_schedule_name(schedule);
    time_it((name + "_up").c_str(), [&g, schedule](int i) { g.up(schedule, i); }, f.up, f.up);
    time_it((name + "_down").c_str(), [&g, schedule](int i) { g.down(schedule, i); }, f.down, f.down);
  }
  for (CutlassBackwardSchedule schedule : kCutlassBackwardSchedules) {
    const std::string name = "cutlass_" + cutlass_bf16_backward_name(schedule);
    time_it((name + "_dgrad").c_str(), [&g, schedule](int i) { g.dgrad(schedule, i); }, f.dgrad, f.dgrad);
    time_it((name + "_dx").c_str(), [&g, schedule](int i) { g.dx(schedule, i); }, f.dx, f.dx);
    time_it((name + "_wgrad").c_str(), [&g, schedule](int i) { g.wgrad(schedule, i); }, f.wgrad, f.wgrad);
  }
}

// `pad`: padded rows over real rows.
void time_fp8(const Fp8Gemms& g, const Flops& f, double pad, const TimeIt& time_it) {
  time_it("fp8_up_gate_swiglu", [&](int i) { g.up(i); }, f.up, f.up * pad);
  time_it("fp8_down", [&](int i) { g.down(i); }, f.down, f.down * pad);
  time_it("fp8_forward", [&](int i) { g.up(i); g.down(i); }, f.forward, f.forward * pad);
  // The activation in e4m3 by the up/gate's epilogue (the layer's), then apart; the last of the
  // forward rows leaves the down GEMM reading the FP8 up's activation quantized apart.
  time_it("fp8_up_gate_swiglu_e4m3", [&](int i) { g.up_e4m3(i); }, f.up, f.up * pad);
  time_it("fp8_forward_e4m3", [&](int i) { g.up_e4m3(i); g.down(i); }, f.forward, f.forward * pad);
  time_it("fp8_quantize_activation", [&](int i) { g.quantize_activation(i); }, 0.0, 0.0);
  time_it("fp8_forward_quantized", [&](int i) { g.up(i); g.quantize_activation(i); g.down(i); }, f.forward,
          f.forward * pad);
  time_it("fp8_dgrad_swiglu", [&](int i) { g.dgrad(i); }, f.dgrad, f.dgrad * pad);
  time_it("fp8_dx", [&](int i) { g.dx(i); }, f.dx, f.dx * pad);
  time_it("fp8_wgrad", [&](int i) { g.wgrad(i); }, f.wgrad, f.wgrad * pad);
  time_it("fp8_wgrad_bf16", [&](int i) { g.wgrad(i, true); }, f.wgrad, f.wgrad * pad);
  time_it("fp8_quantize_wgrad_operands", [&](int i) { g.quantize_wgrad_operands(i); }, 0.0, 0.0);
  time_it("cutlass_fp8_up", [&](int i) { g.cutlass_up(i); }, f.up, f.up);
  time_it("cutlass_fp8_down", [&](int i) { g.cutlass_down(i); }, f.down, f.down);
  // CUTLASS's K is each expert's rows rounded up to the scaling block, as ours.
  for (CutlassBackwardSchedule schedule : kCutlassBackwardSchedules) {
    time_it((std::string("cutlass_fp8_wgrad_") + cutlass_backward_schedule_name(schedule)).c_str(),
            [&g, schedule](int i) { g.cutlass_wgrad(schedule, i); }, f.wgrad, f.wgrad * pad);
  }
}

// CUTLASS's outputs of input set 0 against ours (the last forward and backward ran on set 0), every
// configuration. The dgrad's product has no counterpart among ours (its SwiGLU epilogue stores what
// follows from it), so it is timed, not compared.
void compare_cutlass(const CutlassBaseline& g, const OurKernels& k, CaseResult& r) {
  r.cutlass_up_rel_diff = r.cutlass_down_rel_diff = r.cutlass_dx_rel_diff = r.cutlass_wgrad_rel_diff = 0.0;
  for (CutlassSchedule schedule : kCutlassSchedules) {
    g.up(schedule, 0);
    g.down(schedule, 0);
    BENCH_CUDA(cudaDeviceSynchronize());
    r.cutlass_up_rel_diff = std::max(r.cutlass_up_rel_diff, g.up_difference(k.gate_up.get()));
    r.cutlass_down_rel_diff = std::max(r.cutlass_down_rel_diff, g.down_difference(k.y.get()));
  }
  for (CutlassBackwardSchedule schedule : kCutlassBackwardSchedules) {
    g.dx(schedule, 0);
    g.wgrad(schedule, 0);
    BENCH_CUDA(cudaDeviceSynchronize());
    r.cutlass_dx_rel_diff = std::max(r.cutlass_dx_rel_diff, g.dx_difference(k.dx.get()));
    r.cutlass_wgrad_rel_diff =
        std::max(r.cutlass_wgrad_rel_diff, g.wgrad_difference(k.d_w_gate_up.get(), k.d_w_down.get()));
  }
}

}  // namespace

CaseResult run_case(const Case& c, cublasHandle_t cublas, int warmup, int reps, uint64_t seed, size_t l2_bytes,
                    bool with_fp8) {
  const std::vector<int32_t> offsets = c.offsets();
  const std::vector<InputSet> in = make_input_sets(c, offsets, seed, l2_bytes);
  const OurKernels k(c, offsets, in, seed);

  CaseResult r;
  // One forward and one backward first, then the spot checks on their outputs.
  k.up(0, true);
  k.down(0);
  k.dgrad(0);
  k.dgrad_x(0);
  k.wgrad(0, false);
  BENCH_CUDA(cudaDeviceSynchronize());
  r.check_rel_err = forward_spot_check(c, in[0], k.hidden, k.y);
  const BackwardOutputs outs{k.gate_up.get(),     k.hidden.get(),   k.gates_host.data(),
                             k.d_gate_up.get(),   k.dx.get(),       k.dg.get(),
                             k.d_w_gate_up.get(), k.d_w_down.get()};
  r.check_rel_err_backward = backward_spot_check(c, in[0], outs).worst();

  std::vector<TimedKernel> kernels;
  const TimeIt time_it = [&](const char* name, const std::function<void(int)>& run, double flops,
                             double padded_flops) { kernels.push_back({name, run, flops, padded_flops, {}}); };
  const Flops flops(c);
  const double pad = double(offsets.back()) / std::max(1.0, double(c.rows()));
  time_ours(k, flops, pad, time_it);
  std::optional<DenseGemms> dense;  // alive while their runs are timed
  std::optional<CutlassBaseline> cutlass;
  std::optional<Fp8Gemms> fp8;
  if (c.rows() > 0) {
    time_dense(dense.emplace(k, cublas), flops, time_it);
    cutlass.emplace(c, offsets, in, k.hidden.get(), k.d_gate_up.get(), k.scaled_activation.get());
    compare_cutlass(*cutlass, k, r);
    time_cutlass(*cutlass, flops, time_it);
  }
  if (with_fp8 && c.rows() > 0 && Fp8Gemms::supported(c)) {
    // k.hidden holds set 0's activation (the first forward): the FP8 down GEMMs' A, quantized;
    // k.gate_up its gate_up, which the FP8 dgrad reads as the bf16 one does.
    fp8.emplace(c, offsets, in, k.hidden.get(), k.gate_up.get(), k.gates.get(), k.d_gate_up.get(),
                k.scaled_activation.get(), k.rows, k.tile_queue.get(), cutlass->d_w_gate_up(), cutlass->d_w_down());
    fp8->up(0);
    fp8->down(0);
    fp8->dgrad(0);
    fp8->dx(0);
    fp8->wgrad(0);
    fp8->cutlass_up(0);
    fp8->cutlass_down(0);
    BENCH_CUDA(cudaDeviceSynchronize());
    r.cutlass_fp8_up_rel_diff = fp8->up_difference();
    r.cutlass_fp8_down_rel_diff = fp8->down_difference();
    r.cutlass_fp8_wgrad_rel_diff = 0.0;
    for (CutlassBackwardSchedule schedule : kCutlassBackwardSchedules) {
      fp8->cutlass_wgrad(schedule, 0);
      BENCH_CUDA(cudaDeviceSynchronize());
      r.cutlass_fp8_wgrad_rel_diff = std::max(r.cutlass_fp8_wgrad_rel_diff, fp8->wgrad_difference());
    }
    r.fp8_output_digest = fp8->output_digest();
    time_fp8(*fp8, flops, pad, time_it);
  }
  time_in_rounds(kernels, warmup, reps, r.timings);
  return r;
}

}  // namespace caracal::bench
