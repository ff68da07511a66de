// caracal_gemm_bench: the grouped-GEMM engine on model shapes, side by side with cuBLAS dense bf16
// GEMMs of the same FLOPs (the practical roofline), in one run:
//   forward   up/gate + SwiGLU, down
//   backward  dgrad of down + SwiGLU backward + router-score gradient, dx, weight gradients (fp32)
//
// Rows: T = 4096 tokens per rank, top-k routed over E experts at W = 8 (caracal::make_routing),
// the per-expert counts of one receiving rank from the schedule host twin (rank 0 for uniform
// routing, the busiest rank for Zipf), padded to 128 rows per expert. Random bf16 data (never
// zeros), padding rows zero as dispatch leaves them, g per row in [0, 1] (0 on padding rows).
// Each timing is the median of --reps runs (CUDA events around each run) after --warmup runs;
// inputs rotate between copies when one set would fit in L2 four times over. Spot checks compare
// a few rows (and a few weight-gradient entries) of every case with an fp64 host computation.
// FLOPs count real rows (useful) and padded rows (what the kernels execute); the backward's are
// twice the forward's: dgrad 2·rows·D·I, dx 2·rows·2I·D, weight gradients 2·rows·3·D·I.
// The cuBLAS rows run each GEMM densely over the real rows with the same operand layouts (the
// weight gradients with fp32 output, as ours).
// --json PATH also writes every figure, and each case's per-expert counts for
// bench/torch_grouped_mm.py.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "caracal/error.hpp"
#include "caracal/gemm/grouped_gemm.hpp"
#include "caracal/gemm/grouped_gemm_backward.hpp"
#include "caracal/presets.hpp"
#include "caracal/routing.hpp"
#include "caracal/schedule.hpp"
#include "event_timer.hpp"
#include "gemm_bench_support.hpp"
#include "gemm_spot_checks.hpp"

namespace {

using caracal::bench::Bf16Array;
using caracal::bench::Case;
using caracal::bench::DeviceArray;
using caracal::bench::InputSet;
using caracal::gemm::kGroupedGemmTileM;

#define BENCH_CUBLAS(expr)                                                                        \
  do {                                                                                            \
    cublasStatus_t bench_st_ = (expr);                                                            \
    CARACAL_CHECK(bench_st_ == CUBLAS_STATUS_SUCCESS, #expr, ": cuBLAS status ", int(bench_st_)); \
  } while (0)

constexpr int kWorld = 8;
constexpr int kTokens = 4096;

// ---- Random data ---------------------------------------------------------------------------------

__device__ uint64_t splitmix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Uniform in [-scale, scale], rounded to bf16; a pure function of (seed, index).
__global__ void fill_uniform_kernel(__nv_bfloat16* out, size_t n, uint64_t seed, float scale) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    uint64_t const h = splitmix64(seed ^ (i * 0xD1B54A32D192ED03ull));
    float const u = float(h >> 40) * (1.0f / float(1 << 24));  // [0, 1)
    out[i] = __float2bfloat16_rn((2.0f * u - 1.0f) * scale);
  }
}

void fill_uniform(__nv_bfloat16* out, size_t n, uint64_t seed, float scale) {
  if (n == 0) return;
  fill_uniform_kernel<<<4096, 256>>>(out, n, seed, scale);
  BENCH_CUDA(cudaGetLastError());
}

// ---- Cases --------------------------------------------------------------------------------------

Case routed_case(const std::string& model, caracal::RoutingKind kind, uint64_t seed) {
  const caracal::ModelPreset& preset = caracal::find_model_preset(model);
  caracal::RoutingSpec spec;
  spec.kind = kind;
  spec.seed = seed;
  const caracal::Routing routing =
      caracal::make_routing(spec, kWorld, kTokens, preset.shape.top_k, preset.shape.num_experts);
  // Uniform: rank 0. Skewed: the busiest rank, the one that sets the step time.
  int best_rank = 0;
  int64_t best_routes = -1;
  caracal::RankSchedule best;
  for (int r = 0; r < (kind == caracal::RoutingKind::kUniform ? 1 : kWorld); ++r) {
    caracal::RankSchedule s =
        caracal::build_rank_schedule(routing, preset.shape.num_experts, kGroupedGemmTileM, r);
    if (s.routes() > best_routes) {
      best_routes = s.routes();
      best_rank = r;
      best = std::move(s);
    }
  }
  Case c;
  c.model = model;
  c.routing = caracal::to_string(spec);
  c.name = model + "/" + c.routing;
  c.hidden = int(preset.shape.hidden);
  c.intermediate = int(preset.shape.intermediate);
  c.num_experts = int(preset.shape.num_experts / kWorld);
  c.top_k = int(preset.shape.top_k);
  c.rank = best_rank;
  c.counts.assign(best.expert_count.begin(), best.expert_count.end());
  return c;
}

std::vector<Case> make_cases(uint64_t seed) {
  std::vector<Case> cases;
  for (const char* model : {"deepseek-v3", "kimi-k2", "qwen3.5-397b"}) {
    cases.push_back(routed_case(model, caracal::RoutingKind::kUniform, seed));
    cases.push_back(routed_case(model, caracal::RoutingKind::kZipf, seed));
  }
  // Empty and one-row experts among full ones: DeepSeek-V3 uniform with 8 experts emptied and 4
  // left with a single row.
  Case sparse = routed_case("deepseek-v3", caracal::RoutingKind::kUniform, seed);
  for (int e = 0; e < 12; ++e) sparse.counts[size_t(e)] = e < 8 ? 0 : 1;
  sparse.routing = "sparse";
  sparse.name = "deepseek-v3/empty+1-row";
  cases.push_back(sparse);
  return cases;
}

// ---- Timing -------------------------------------------------------------------------------------

struct Timing {
  double ms = 0.0;             // median
  double min_ms = 0.0, max_ms = 0.0;
  double tflops = 0.0;         // useful FLOPs (real rows) per second, at the median
  double tflops_padded = 0.0;  // FLOPs the kernels execute (padded rows)
};

Timing make_timing(const caracal::bench::RunTimes& times, double useful_flops, double padded_flops) {
  Timing t;
  const double ms = times.median_ms;
  t.ms = ms;
  t.min_ms = times.min_ms;
  t.max_ms = times.max_ms;
  t.tflops = useful_flops / (ms * 1e-3) / 1e12;
  t.tflops_padded = padded_flops / (ms * 1e-3) / 1e12;
  return t;
}

// ---- One case -----------------------------------------------------------------------------------

struct CaseResult {
  std::map<std::string, Timing> timings;
  double check_rel_err = 0.0;           // forward spot check
  double check_rel_err_backward = 0.0;  // backward spot check (worst of its parts)
};

// C[m][n] (row-major, c_type bf16 or fp32) = sum_k A(m, k) B(k, n) with cuBLAS, bf16 operands,
// fp32 compute. A is stored [m][k] (a_k_major) or [k][m]; B is stored [n][k] (b_k_major) or
// [k][n]: the layouts our kernels read.
void cublas_gemm(cublasHandle_t h, const __nv_bfloat16* a, bool a_k_major, const __nv_bfloat16* b,
                 bool b_k_major, void* c, cudaDataType c_type, int m, int n, int k) {
  const float alpha = 1.0f, beta = 0.0f;
  // Column-major view: C^T (n x m) = op(B) * op(A), op turning each stored view into B^T / A^T.
  BENCH_CUBLAS(cublasGemmEx(h, b_k_major ? CUBLAS_OP_T : CUBLAS_OP_N,
                            a_k_major ? CUBLAS_OP_N : CUBLAS_OP_T, n, m, k, &alpha, b, CUDA_R_16BF,
                            b_k_major ? k : n, a, CUDA_R_16BF, a_k_major ? k : m, &beta, c, c_type,
                            n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

CaseResult run_case(const Case& c, cublasHandle_t cublas, int warmup, int reps, uint64_t seed,
                    size_t l2_bytes) {
  const size_t D = size_t(c.hidden), I = size_t(c.intermediate), L = size_t(c.num_experts);
  const std::vector<int32_t> offsets = c.offsets();
  const size_t cap = size_t(offsets.back());
  const int rows = int(c.rows());

  // Input sets: one, or as many as keep four L2s' worth of distinct inputs in rotation.
  const size_t set_bytes = 2 * (2 * cap * D + L * 2 * I * D + L * D * I);
  const int sets =
      int(std::min<size_t>(8, std::max<size_t>(1, (4 * l2_bytes + set_bytes - 1) / set_bytes)));
  std::vector<InputSet> in(static_cast<size_t>(sets));
  for (int s = 0; s < sets; ++s) {
    InputSet& set = in[size_t(s)];
    set.x.resize(cap * D);
    set.dy.resize(cap * D);
    set.w_gate_up.resize(L * 2 * I * D);
    set.w_down.resize(L * D * I);
    fill_uniform(set.x.get(), cap * D, seed + 100 * uint64_t(s) + 1, 1.0f);
    fill_uniform(set.w_gate_up.get(), L * 2 * I * D, seed + 100 * uint64_t(s) + 2,
                 float(std::sqrt(3.0 / double(D))));
    fill_uniform(set.w_down.get(), L * D * I, seed + 100 * uint64_t(s) + 3,
                 float(std::sqrt(3.0 / double(I))));
    fill_uniform(set.dy.get(), cap * D, seed + 100 * uint64_t(s) + 4, 1.0f);
    for (size_t e = 0; e < L; ++e) {  // padding rows hold zeros, as the transfers leave them
      const size_t first_pad = size_t(offsets[e]) + size_t(c.counts[e]);
      const size_t pad_bytes = (size_t(offsets[e + 1]) - first_pad) * D * 2;
      BENCH_CUDA(cudaMemset(set.x.get() + first_pad * D, 0, pad_bytes));
      BENCH_CUDA(cudaMemset(set.dy.get() + first_pad * D, 0, pad_bytes));
    }
  }
  Bf16Array hidden(cap * I), gate_up(cap * 2 * I), y(cap * D);
  Bf16Array d_gate_up(cap * 2 * I), scaled_activation(cap * I), dx(cap * D);
  DeviceArray<float> gates(cap), dg(cap);
  DeviceArray<float> workspace(caracal::gemm::down_dgrad_workspace_floats(int(cap), int(I)));
  DeviceArray<float> d_w_gate_up(L * 2 * I * D), d_w_down(L * D * I);
  DeviceArray<__nv_bfloat16> d_w_gate_up_bf16(L * 2 * I * D), d_w_down_bf16(L * D * I);
  Bf16Array dense_out(std::max<size_t>(1, size_t(rows) * std::max(2 * I, D)));
  DeviceArray<float> dense_grad(2 * I * D);
  DeviceArray<int32_t> d_offsets(offsets.size()), d_counts(L);
  BENCH_CUDA(
      cudaMemcpy(d_offsets.get(), offsets.data(), offsets.size() * 4, cudaMemcpyHostToDevice));
  const std::vector<int32_t> counts32(c.counts.begin(), c.counts.end());
  BENCH_CUDA(cudaMemcpy(d_counts.get(), counts32.data(), L * 4, cudaMemcpyHostToDevice));
  const std::vector<float> gates_host = caracal::bench::padded_row_gates(c.counts, seed);
  BENCH_CUDA(cudaMemcpy(gates.get(), gates_host.data(), cap * 4, cudaMemcpyHostToDevice));

  caracal::ScheduleView er;
  er.expert_offset = d_offsets.get();
  er.expert_count = d_counts.get();
  er.num_experts = int(L);
  er.row_capacity = int(cap);
  auto up = [&](int iter, bool store_gate_up) {
    const InputSet& s = in[size_t(iter % sets)];
    caracal::gemm::UpGateSwigluArgs a;
    a.rows = er;
    a.hidden = c.hidden;
    a.intermediate = c.intermediate;
    a.x = s.x.get();
    a.w_gate_up = s.w_gate_up.get();
    a.activation_out = hidden.get();
    a.gate_up_out = store_gate_up ? gate_up.get() : nullptr;
    caracal::gemm::grouped_up_gate_swiglu(a, nullptr);
  };
  auto down = [&](int iter) {
    const InputSet& s = in[size_t(iter % sets)];
    caracal::gemm::DownProjArgs a;
    a.rows = er;
    a.hidden = c.hidden;
    a.intermediate = c.intermediate;
    a.activation = hidden.get();
    a.w_down = s.w_down.get();
    a.y_out = y.get();
    caracal::gemm::grouped_down_proj(a, nullptr);
  };
  auto dgrad = [&](int iter) {
    const InputSet& s = in[size_t(iter % sets)];
    caracal::gemm::DownDgradSwigluArgs a;
    a.rows = er;
    a.hidden = c.hidden;
    a.intermediate = c.intermediate;
    a.dy = s.dy.get();
    a.w_down = s.w_down.get();
    a.gate_up = gate_up.get();
    a.gates = gates.get();
    a.d_gate_up_out = d_gate_up.get();
    a.scaled_activation_out = scaled_activation.get();
    a.d_gates_out = dg.get();
    a.workspace = workspace.get();
    caracal::gemm::grouped_down_dgrad_swiglu(a, nullptr);
  };
  auto dgrad_x = [&](int iter) {
    const InputSet& s = in[size_t(iter % sets)];
    caracal::gemm::GateUpDgradArgs a;
    a.rows = er;
    a.hidden = c.hidden;
    a.intermediate = c.intermediate;
    a.d_gate_up = d_gate_up.get();
    a.w_gate_up = s.w_gate_up.get();
    a.dx_out = dx.get();
    caracal::gemm::grouped_gate_up_dgrad(a, nullptr);
  };
  auto wgrad = [&](int iter, bool bf16_grads) {
    const InputSet& s = in[size_t(iter % sets)];
    caracal::gemm::WeightGradArgs a;
    a.rows = er;
    a.hidden = c.hidden;
    a.intermediate = c.intermediate;
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
    caracal::gemm::grouped_weight_grads(a, nullptr);
  };

  const double up_flops = 2.0 * double(rows) * double(D) * double(2 * I);
  const double down_flops = 2.0 * double(rows) * double(I) * double(D);
  const double fwd_flops = up_flops + down_flops;
  const double dgrad_flops = down_flops;   // dy · W_down
  const double dx_flops = up_flops;        // d_gate_up · W_gate_up
  const double wgrad_flops = fwd_flops;    // d_gate_up^T x and dy^T hidden
  const double bwd_flops = dgrad_flops + dx_flops + wgrad_flops;
  const double pad = double(cap) / std::max(1.0, double(rows));

  CaseResult r;
  // One forward and one backward first, then the spot checks on their outputs.
  up(0, true);
  down(0);
  dgrad(0);
  dgrad_x(0);
  wgrad(0, false);
  BENCH_CUDA(cudaDeviceSynchronize());
  r.check_rel_err = caracal::bench::forward_spot_check(c, in[0], hidden, y);
  const caracal::bench::BackwardOutputs outs{gate_up.get(), hidden.get(),   gates_host.data(),
                                             d_gate_up.get(), dx.get(),     dg.get(),
                                             d_w_gate_up.get(), d_w_down.get()};
  r.check_rel_err_backward = caracal::bench::backward_spot_check(c, in[0], outs).worst();

  auto time_it = [&](const char* name, const std::function<void(int)>& fn, double flops,
                  double padded_flops) {
    r.timings[name] = make_timing(caracal::bench::time_runs(nullptr, warmup, reps, fn), flops, padded_flops);
  };
  time_it("up_gate_swiglu", [&](int i) { up(i, true); }, up_flops, up_flops * pad);
  time_it("up_gate_swiglu_hidden_only", [&](int i) { up(i, false); }, up_flops, up_flops * pad);
  time_it("down", down, down_flops, down_flops * pad);
  time_it("forward", [&](int i) { up(i, true); down(i); }, fwd_flops, fwd_flops * pad);
  // The backward reads the gate_up of the last forward; its inputs do not change its speed.
  time_it("dgrad_swiglu", dgrad, dgrad_flops, dgrad_flops * pad);
  time_it("dx", dgrad_x, dx_flops, dx_flops * pad);
  time_it("wgrad", [&](int i) { wgrad(i, false); }, wgrad_flops, wgrad_flops * pad);
  time_it("wgrad_bf16", [&](int i) { wgrad(i, true); }, wgrad_flops, wgrad_flops * pad);
  time_it("backward", [&](int i) { dgrad(i); dgrad_x(i); wgrad(i, false); }, bwd_flops, bwd_flops * pad);

  if (rows > 0) {
    const int n_i = int(I), n_d = int(D);
    auto dense_up = [&](int i) {
      const InputSet& s = in[size_t(i % sets)];
      cublas_gemm(cublas, s.x.get(), true, s.w_gate_up.get(), true, dense_out.get(), CUDA_R_16BF,
                  rows, 2 * n_i, n_d);
    };
    auto dense_down = [&](int i) {
      const InputSet& s = in[size_t(i % sets)];
      cublas_gemm(cublas, hidden.get(), true, s.w_down.get(), true, dense_out.get(), CUDA_R_16BF,
                  rows, n_d, n_i);
    };
    // The backward's GEMMs over the first `rows` rows with one expert's weights.
    auto dense_dgrad = [&](int i) {
      const InputSet& s = in[size_t(i % sets)];
      cublas_gemm(cublas, s.dy.get(), true, s.w_down.get(), false, dense_out.get(), CUDA_R_16BF,
                  rows, n_i, n_d);
    };
    auto dense_dx = [&](int i) {
      const InputSet& s = in[size_t(i % sets)];
      cublas_gemm(cublas, d_gate_up.get(), true, s.w_gate_up.get(), false, dense_out.get(),
                  CUDA_R_16BF, rows, n_d, 2 * n_i);
    };
    auto dense_wgrad = [&](int i) {
      const InputSet& s = in[size_t(i % sets)];
      cublas_gemm(cublas, d_gate_up.get(), false, s.x.get(), false, dense_grad.get(), CUDA_R_32F,
                  2 * n_i, n_d, rows);
      cublas_gemm(cublas, s.dy.get(), false, scaled_activation.get(), false, dense_grad.get(),
                  CUDA_R_32F, n_d, n_i, rows);
    };
    time_it("cublas_up", dense_up, up_flops, up_flops);
    time_it("cublas_down", dense_down, down_flops, down_flops);
    time_it("cublas_forward", [&](int i) { dense_up(i); dense_down(i); }, fwd_flops, fwd_flops);
    time_it("cublas_dgrad", dense_dgrad, dgrad_flops, dgrad_flops);
    time_it("cublas_dx", dense_dx, dx_flops, dx_flops);
    time_it("cublas_wgrad", dense_wgrad, wgrad_flops, wgrad_flops);
    time_it("cublas_backward", [&](int i) { dense_dgrad(i); dense_dx(i); dense_wgrad(i); },
         bwd_flops, bwd_flops);
  }
  return r;
}

// ---- Output -------------------------------------------------------------------------------------

void print_header() {
  std::printf("%-26s %6s %6s %-22s %8s %6s %8s %8s %9s %8s %7s\n", "case", "rows", "padded", "kernel",
              "ms", "spread", "TFLOP/s", "padded", "cuBLAS ms", "cuBLAS", "ratio");
}

void print_row(const Case& c, const std::vector<int32_t>& offsets, const std::string& label,
               const Timing& t, const Timing* dense, bool first) {
  char dense_ms[32] = "-", dense_tf[32] = "-", ratio[32] = "-";
  if (dense) {
    std::snprintf(dense_ms, sizeof dense_ms, "%.3f", dense->ms);
    std::snprintf(dense_tf, sizeof dense_tf, "%.1f", dense->tflops);
    std::snprintf(ratio, sizeof ratio, "%.3f", t.tflops / dense->tflops);
  }
  // spread: (max - min) / median of the timed runs, in percent.
  std::printf("%-26s %6s %6s %-22s %8.3f %5.1f%% %8.1f %8.1f %9s %8s %7s\n", first ? c.name.c_str() : "",
              first ? std::to_string(c.rows()).c_str() : "",
              first ? std::to_string(offsets.back()).c_str() : "", label.c_str(), t.ms,
              100.0 * (t.max_ms - t.min_ms) / t.ms, t.tflops, t.tflops_padded, dense_ms, dense_tf, ratio);
}

nlohmann::json timing_json(const Timing& t) {
  return {{"ms", t.ms},
          {"min_ms", t.min_ms},
          {"max_ms", t.max_ms},
          {"tflops", t.tflops},
          {"tflops_padded", t.tflops_padded}};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"caracal_gemm_bench: grouped-GEMM forward and backward vs cuBLAS dense GEMM of the same FLOPs"};
  int warmup = 5, reps = 30;
  uint64_t seed = 2026;
  std::string json_path;
  std::vector<std::string> only;
  app.add_option("--warmup", warmup, "untimed runs before timing (at least; and at least 200 ms of them)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--reps", reps, "timed runs (median reported)")->check(CLI::Range(1, 100000));
  app.add_option("--seed", seed, "routing and data seed");
  app.add_option("--json", json_path, "also write every figure (and the cases' counts) as JSON");
  app.add_option("--case", only, "run only cases whose name contains this (repeatable)");
  bool list = false;
  app.add_flag("--list", list, "print the cases' row counts and exit (no GPU needed)");
  CLI11_PARSE(app, argc, argv);

  try {
    if (list) {
      std::printf("%-26s %4s %5s %7s %7s %6s %6s %6s\n", "case", "L", "rank", "rows", "padded",
                  "min", "max", "empty");
      for (const Case& c : make_cases(seed)) {
        const auto [lo, hi] = std::minmax_element(c.counts.begin(), c.counts.end());
        std::printf("%-26s %4d %5d %7lld %7d %6d %6d %6lld\n", c.name.c_str(), c.num_experts,
                    c.rank, static_cast<long long>(c.rows()), c.offsets().back(), *lo, *hi,
                    static_cast<long long>(std::count(c.counts.begin(), c.counts.end(), 0)));
      }
      return 0;
    }
    int device = 0;
    cudaDeviceProp prop{};
    BENCH_CUDA(cudaGetDevice(&device));
    BENCH_CUDA(cudaGetDeviceProperties(&prop, device));
    CARACAL_CHECK(prop.major == 9 && prop.minor == 0,
                  "caracal_gemm_bench needs a Hopper (sm_90) GPU, found ", prop.name);
    cublasHandle_t cublas = nullptr;
    BENCH_CUBLAS(cublasCreate(&cublas));

    std::printf(
        "caracal_gemm_bench: %s, %d SMs, %.0f MB L2; T=%d tokens/rank, W=%d, "
        "median of %d runs after %d warm-up\n",
        prop.name, prop.multiProcessorCount, prop.l2CacheSize / 1e6, kTokens, kWorld, reps, warmup);
    print_header();
    nlohmann::json cases_json = nlohmann::json::array();
    bool check_failed = false;
    for (const Case& c : make_cases(seed)) {
      if (!only.empty() && std::none_of(only.begin(), only.end(), [&](const std::string& s) {
            return c.name.find(s) != std::string::npos;
          })) {
        continue;
      }
      const CaseResult r = run_case(c, cublas, warmup, reps, seed, size_t(prop.l2CacheSize));
      const auto offsets = c.offsets();
      auto cu = [&](const char* k) -> const Timing* {
        auto it = r.timings.find(k);
        return it == r.timings.end() ? nullptr : &it->second;
      };
      print_row(c, offsets, "up+swiglu (+gate_up)", r.timings.at("up_gate_swiglu"), cu("cublas_up"),
                true);
      print_row(c, offsets, "up+swiglu (hidden)", r.timings.at("up_gate_swiglu_hidden_only"),
                cu("cublas_up"), false);
      print_row(c, offsets, "down", r.timings.at("down"), cu("cublas_down"), false);
      print_row(c, offsets, "forward", r.timings.at("forward"), cu("cublas_forward"), false);
      print_row(c, offsets, "dgrad+swiglu bwd", r.timings.at("dgrad_swiglu"), cu("cublas_dgrad"),
                false);
      print_row(c, offsets, "dx", r.timings.at("dx"), cu("cublas_dx"), false);
      print_row(c, offsets, "wgrad (fp32)", r.timings.at("wgrad"), cu("cublas_wgrad"), false);
      print_row(c, offsets, "wgrad (bf16)", r.timings.at("wgrad_bf16"), cu("cublas_wgrad"), false);
      print_row(c, offsets, "backward", r.timings.at("backward"), cu("cublas_backward"), false);
      auto check = [&](const char* what, double err) {
        const bool ok = std::isfinite(err) && err <= 1e-2;
        check_failed |= !ok;
        std::printf("%-26s %s spot check vs fp64: rel err %.2e %s\n", "", what, err,
                    ok ? "ok" : "FAILED");
      };
      check("forward", r.check_rel_err);
      check("backward", r.check_rel_err_backward);

      nlohmann::json cj = {{"name", c.name},
                           {"model", c.model},
                           {"routing", c.routing},
                           {"hidden", c.hidden},
                           {"intermediate", c.intermediate},
                           {"num_experts", c.num_experts},
                           {"top_k", c.top_k},
                           {"tokens_per_rank", kTokens},
                           {"world", kWorld},
                           {"rank", c.rank},
                           {"counts", c.counts},
                           {"rows", c.rows()},
                           {"padded_rows", offsets.back()},
                           {"check_rel_err", r.check_rel_err},
                           {"check_rel_err_backward", r.check_rel_err_backward}};
      for (const auto& [k, t] : r.timings) cj["results"][k] = timing_json(t);
      cases_json.push_back(cj);
    }
    BENCH_CUBLAS(cublasDestroy(cublas));
    if (!json_path.empty()) {
      nlohmann::json out = {{"device", prop.name}, {"sms", prop.multiProcessorCount},
                            {"warmup", warmup},    {"reps", reps},
                            {"seed", seed},        {"cases", cases_json}};
      std::ofstream f(json_path);
      CARACAL_CHECK(bool(f), "cannot write --json ", json_path);
      f << out.dump(1) << "\n";
    }
    return check_failed ? 2 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "caracal_gemm_bench: error: %s\n", e.what());
    return 1;
  }
}
