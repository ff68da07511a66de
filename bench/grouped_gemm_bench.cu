// caracal_gemm_bench: the grouped-GEMM forward (up/gate + SwiGLU, down) on model shapes, side by
// side with cuBLAS dense bf16 GEMMs of the same FLOPs (the practical roofline), in one run.
//
// Rows: T = 4096 tokens per rank, top-k routed over E experts at W = 8 (caracal::make_routing),
// the per-expert counts of one receiving rank from the schedule host twin (rank 0 for uniform
// routing, the busiest rank for Zipf), padded to 128 rows per expert. Random bf16 data (never
// zeros), padding rows zero as dispatch leaves them. Each timing is the median of --reps runs
// (CUDA events around each run) after --warmup runs; inputs rotate between copies when one set
// would fit in L2 four times over. A spot check compares a few rows of every case with an fp64
// host computation. FLOPs count real rows (useful) and padded rows (what the kernels execute).
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

#include "caracal/bf16.hpp"
#include "caracal/error.hpp"
#include "caracal/kernels/grouped_gemm.hpp"
#include "caracal/presets.hpp"
#include "caracal/routing.hpp"
#include "caracal/schedule.hpp"

namespace {

using caracal::kernels::kGroupedGemmTileM;

#define BENCH_CUDA(expr)                                                                   \
  do {                                                                                     \
    cudaError_t bench_err_ = (expr);                                                       \
    CARACAL_CHECK(bench_err_ == cudaSuccess, #expr, ": ", cudaGetErrorString(bench_err_)); \
  } while (0)
#define BENCH_CUBLAS(expr)                                                                        \
  do {                                                                                            \
    cublasStatus_t bench_st_ = (expr);                                                            \
    CARACAL_CHECK(bench_st_ == CUBLAS_STATUS_SUCCESS, #expr, ": cuBLAS status ", int(bench_st_)); \
  } while (0)

constexpr int kWorld = 8;
constexpr int kTokens = 4096;

// ---- Device buffers and random data -------------------------------------------------------------

template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t count = 0) { resize(count); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  DeviceArray(DeviceArray&& o) noexcept : ptr_(o.ptr_), count_(o.count_) { o.ptr_ = nullptr; }
  ~DeviceArray() {
    if (ptr_) cudaFree(ptr_);
  }
  void resize(size_t count) {
    if (ptr_) BENCH_CUDA(cudaFree(ptr_));
    ptr_ = nullptr;
    count_ = count;
    if (count) BENCH_CUDA(cudaMalloc(reinterpret_cast<void**>(&ptr_), count * sizeof(T)));
  }
  T* get() const { return ptr_; }
  size_t size() const { return count_; }
  size_t bytes() const { return count_ * sizeof(T); }

 private:
  T* ptr_ = nullptr;
  size_t count_ = 0;
};

using Bf16Array = DeviceArray<__nv_bfloat16>;

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

struct Case {
  std::string name;  // e.g. "deepseek-v3/uniform"
  std::string model;
  std::string routing;  // uniform | zipf:1 | sparse
  int hidden = 0, intermediate = 0, num_experts = 0, top_k = 0, rank = 0;
  std::vector<int> counts;  // per local expert
  int64_t rows() const {
    int64_t r = 0;
    for (int c : counts) r += c;
    return r;
  }
  std::vector<int32_t> offsets() const {
    std::vector<int32_t> o{0};
    for (int c : counts) {
      o.push_back(o.back() + (c + kGroupedGemmTileM - 1) / kGroupedGemmTileM * kGroupedGemmTileM);
    }
    return o;
  }
};

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
  double ms = 0.0;
  double tflops = 0.0;         // useful FLOPs (real rows) per second
  double tflops_padded = 0.0;  // FLOPs the kernels execute (padded rows)
};

// Median of `reps` runs of fn(iteration), each bracketed by CUDA events, after `warmup` runs.
double median_ms(const std::function<void(int)>& fn, int warmup, int reps) {
  for (int i = 0; i < warmup; ++i) fn(i);
  const size_t n = size_t(reps);
  std::vector<cudaEvent_t> start(n), stop(n);
  for (int i = 0; i < reps; ++i) {
    BENCH_CUDA(cudaEventCreate(&start[size_t(i)]));
    BENCH_CUDA(cudaEventCreate(&stop[size_t(i)]));
  }
  for (int i = 0; i < reps; ++i) {
    BENCH_CUDA(cudaEventRecord(start[size_t(i)]));
    fn(warmup + i);
    BENCH_CUDA(cudaEventRecord(stop[size_t(i)]));
  }
  BENCH_CUDA(cudaDeviceSynchronize());
  std::vector<double> ms(n);
  for (int i = 0; i < reps; ++i) {
    float t = 0.0f;
    BENCH_CUDA(cudaEventElapsedTime(&t, start[size_t(i)], stop[size_t(i)]));
    ms[size_t(i)] = double(t);
    BENCH_CUDA(cudaEventDestroy(start[size_t(i)]));
    BENCH_CUDA(cudaEventDestroy(stop[size_t(i)]));
  }
  std::sort(ms.begin(), ms.end());
  return reps % 2 ? ms[size_t(reps / 2)] : 0.5 * (ms[size_t(reps / 2 - 1)] + ms[size_t(reps / 2)]);
}

Timing make_timing(double ms, double useful_flops, double padded_flops) {
  Timing t;
  t.ms = ms;
  t.tflops = useful_flops / (ms * 1e-3) / 1e12;
  t.tflops_padded = padded_flops / (ms * 1e-3) / 1e12;
  return t;
}

// ---- One case -----------------------------------------------------------------------------------

// One set of inputs (rotated between when a set would sit in L2).
struct InputSet {
  Bf16Array x, w_gate_up, w_down;
};

struct CaseResult {
  std::map<std::string, Timing> timings;
  double check_rel_err = 0.0;
};

// C[m][n] = A[m][:] . B[n][:] (row-major, both K-major) with cuBLAS, bf16 in/out, fp32 compute.
void cublas_gemm_tn(cublasHandle_t h, const __nv_bfloat16* a, const __nv_bfloat16* b,
                    __nv_bfloat16* c, int m, int n, int k) {
  const float alpha = 1.0f, beta = 0.0f;
  // Column-major view: C^T (n x m) = B (n x k, stored as k x n) ^T * A^T (k x m).
  BENCH_CUBLAS(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, b, CUDA_R_16BF, k, a,
                            CUDA_R_16BF, k, &beta, c, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT));
}

std::vector<uint16_t> download_bits(const __nv_bfloat16* p, size_t count) {
  std::vector<uint16_t> v(count);
  BENCH_CUDA(cudaMemcpy(v.data(), p, count * 2, cudaMemcpyDeviceToHost));
  return v;
}

// fp64 recomputation (bf16-rounding contract) of a few real rows from the device's own inputs;
// returns the relative Frobenius error of hidden and y over those rows together.
double spot_check(const Case& c, const std::vector<int32_t>& offsets, const InputSet& in,
                  const Bf16Array& hidden, const Bf16Array& y) {
  const size_t D = size_t(c.hidden), I = size_t(c.intermediate);
  // (expert, row): the first real row, a middle row of the largest expert, the last real row.
  std::vector<std::pair<int, int64_t>> picks;
  int largest = 0;
  for (int e = 0; e < c.num_experts; ++e) {
    if (c.counts[size_t(e)] > c.counts[size_t(largest)]) largest = e;
  }
  for (int e = 0; e < c.num_experts; ++e) {
    if (c.counts[size_t(e)] > 0) {
      picks.push_back({e, offsets[size_t(e)]});
      break;
    }
  }
  if (c.counts[size_t(largest)] > 0) {
    picks.push_back({largest, offsets[size_t(largest)] + c.counts[size_t(largest)] / 2});
  }
  for (int e = c.num_experts - 1; e >= 0; --e) {
    if (c.counts[size_t(e)] > 0) {
      picks.push_back({e, offsets[size_t(e)] + c.counts[size_t(e)] - 1});
      break;
    }
  }
  double err2 = 0.0, ref2 = 0.0;
  int cached_expert = -1;
  std::vector<double> wgu, wd;
  for (const auto& [e, row] : picks) {
    if (e != cached_expert) {
      wgu = caracal::from_bf16_bits(
          download_bits(in.w_gate_up.get() + size_t(e) * 2 * I * D, 2 * I * D));
      wd = caracal::from_bf16_bits(download_bits(in.w_down.get() + size_t(e) * D * I, D * I));
      cached_expert = e;
    }
    const auto x = caracal::from_bf16_bits(download_bits(in.x.get() + size_t(row) * D, D));
    const auto h_dev = caracal::from_bf16_bits(download_bits(hidden.get() + size_t(row) * I, I));
    const auto y_dev = caracal::from_bf16_bits(download_bits(y.get() + size_t(row) * D, D));
    std::vector<double> h(I);
    for (size_t j = 0; j < I; ++j) {
      double g = 0.0, u = 0.0;
      const double* g_row = &wgu[size_t(caracal::kernels::gate_up_row(int64_t(j), false)) * D];
      const double* u_row = &wgu[size_t(caracal::kernels::gate_up_row(int64_t(j), true)) * D];
      for (size_t d = 0; d < D; ++d) {
        g += x[d] * g_row[d];
        u += x[d] * u_row[d];
      }
      g = caracal::round_to_bf16(g);
      u = caracal::round_to_bf16(u);
      h[j] = caracal::round_to_bf16(g / (1.0 + std::exp(-g)) * u);
      err2 += (h_dev[j] - h[j]) * (h_dev[j] - h[j]);
      ref2 += h[j] * h[j];
    }
    for (size_t d = 0; d < D; ++d) {
      double acc = 0.0;
      for (size_t j = 0; j < I; ++j) acc += h[j] * wd[d * I + j];
      acc = caracal::round_to_bf16(acc);
      err2 += (y_dev[d] - acc) * (y_dev[d] - acc);
      ref2 += acc * acc;
    }
  }
  return ref2 > 0.0 ? std::sqrt(err2 / ref2) : 0.0;  // NaN in the outputs propagates to err2
}

CaseResult run_case(const Case& c, cublasHandle_t cublas, int warmup, int reps, uint64_t seed,
                    size_t l2_bytes) {
  const size_t D = size_t(c.hidden), I = size_t(c.intermediate), L = size_t(c.num_experts);
  const std::vector<int32_t> offsets = c.offsets();
  const size_t cap = size_t(offsets.back());
  const int rows = int(c.rows());

  // Input sets: one, or as many as keep four L2s' worth of distinct inputs in rotation.
  const size_t set_bytes = 2 * (cap * D + L * 2 * I * D + L * D * I);
  const int sets =
      int(std::min<size_t>(8, std::max<size_t>(1, (4 * l2_bytes + set_bytes - 1) / set_bytes)));
  std::vector<InputSet> in(static_cast<size_t>(sets));
  for (int s = 0; s < sets; ++s) {
    InputSet& set = in[size_t(s)];
    set.x.resize(cap * D);
    set.w_gate_up.resize(L * 2 * I * D);
    set.w_down.resize(L * D * I);
    fill_uniform(set.x.get(), cap * D, seed + 100 * uint64_t(s) + 1, 1.0f);
    fill_uniform(set.w_gate_up.get(), L * 2 * I * D, seed + 100 * uint64_t(s) + 2,
                 float(std::sqrt(3.0 / double(D))));
    fill_uniform(set.w_down.get(), L * D * I, seed + 100 * uint64_t(s) + 3,
                 float(std::sqrt(3.0 / double(I))));
    for (size_t e = 0; e < L; ++e) {  // padding rows hold zeros, as dispatch leaves them
      const size_t first_pad = size_t(offsets[e]) + size_t(c.counts[e]);
      BENCH_CUDA(
          cudaMemset(set.x.get() + first_pad * D, 0, (size_t(offsets[e + 1]) - first_pad) * D * 2));
    }
  }
  Bf16Array hidden(cap * I), gate_up(cap * 2 * I), y(cap * D);
  Bf16Array dense_out(std::max<size_t>(1, size_t(rows) * std::max(2 * I, D)));
  DeviceArray<int32_t> d_offsets(offsets.size()), d_counts(L);
  BENCH_CUDA(
      cudaMemcpy(d_offsets.get(), offsets.data(), offsets.size() * 4, cudaMemcpyHostToDevice));
  const std::vector<int32_t> counts32(c.counts.begin(), c.counts.end());
  BENCH_CUDA(cudaMemcpy(d_counts.get(), counts32.data(), L * 4, cudaMemcpyHostToDevice));

  caracal::kernels::ExpertRows er;
  er.expert_offset = d_offsets.get();
  er.expert_count = d_counts.get();
  er.num_experts = int(L);
  er.row_capacity = int(cap);
  auto up = [&](int iter, bool store_gate_up) {
    const InputSet& s = in[size_t(iter % sets)];
    caracal::kernels::UpGateSwigluArgs a;
    a.rows = er;
    a.hidden = c.hidden;
    a.intermediate = c.intermediate;
    a.x = s.x.get();
    a.w_gate_up = s.w_gate_up.get();
    a.hidden_out = hidden.get();
    a.gate_up_out = store_gate_up ? gate_up.get() : nullptr;
    caracal::kernels::grouped_up_gate_swiglu(a, nullptr);
  };
  auto down = [&](int iter) {
    const InputSet& s = in[size_t(iter % sets)];
    caracal::kernels::DownProjArgs a;
    a.rows = er;
    a.hidden = c.hidden;
    a.intermediate = c.intermediate;
    a.hidden_in = hidden.get();
    a.w_down = s.w_down.get();
    a.y_out = y.get();
    caracal::kernels::grouped_down_proj(a, nullptr);
  };

  const double up_flops = 2.0 * double(rows) * double(D) * double(2 * I);
  const double down_flops = 2.0 * double(rows) * double(I) * double(D);
  const double pad = double(cap) / std::max(1.0, double(rows));

  CaseResult r;
  // One forward first, then the spot check on its outputs.
  up(0, true);
  down(0);
  BENCH_CUDA(cudaDeviceSynchronize());
  r.check_rel_err = spot_check(c, offsets, in[0], hidden, y);

  double ms = median_ms([&](int i) { up(i, true); }, warmup, reps);
  r.timings["up_gate_swiglu"] = make_timing(ms, up_flops, up_flops * pad);
  ms = median_ms([&](int i) { up(i, false); }, warmup, reps);
  r.timings["up_gate_swiglu_hidden_only"] = make_timing(ms, up_flops, up_flops * pad);
  ms = median_ms(down, warmup, reps);
  r.timings["down"] = make_timing(ms, down_flops, down_flops * pad);
  ms = median_ms(
      [&](int i) {
        up(i, true);
        down(i);
      },
      warmup, reps);
  r.timings["forward"] = make_timing(ms, up_flops + down_flops, (up_flops + down_flops) * pad);

  if (rows > 0) {
    auto dense_up = [&](int i) {
      const InputSet& s = in[size_t(i % sets)];
      cublas_gemm_tn(cublas, s.x.get(), s.w_gate_up.get(), dense_out.get(), rows, int(2 * I),
                     int(D));
    };
    auto dense_down = [&](int i) {
      const InputSet& s = in[size_t(i % sets)];
      cublas_gemm_tn(cublas, hidden.get(), s.w_down.get(), dense_out.get(), rows, int(D), int(I));
    };
    ms = median_ms(dense_up, warmup, reps);
    r.timings["cublas_up"] = make_timing(ms, up_flops, up_flops);
    ms = median_ms(dense_down, warmup, reps);
    r.timings["cublas_down"] = make_timing(ms, down_flops, down_flops);
    ms = median_ms(
        [&](int i) {
          dense_up(i);
          dense_down(i);
        },
        warmup, reps);
    r.timings["cublas_forward"] = make_timing(ms, up_flops + down_flops, up_flops + down_flops);
  }
  return r;
}

// ---- Output -------------------------------------------------------------------------------------

void print_header() {
  std::printf("%-26s %6s %6s %-22s %8s %8s %8s %9s %8s %7s\n", "case", "rows", "padded", "kernel",
              "ms", "TFLOP/s", "padded", "cuBLAS ms", "cuBLAS", "ratio");
}

void print_row(const Case& c, const std::vector<int32_t>& offsets, const std::string& label,
               const Timing& t, const Timing* dense, bool first) {
  char dense_ms[32] = "-", dense_tf[32] = "-", ratio[32] = "-";
  if (dense) {
    std::snprintf(dense_ms, sizeof dense_ms, "%.3f", dense->ms);
    std::snprintf(dense_tf, sizeof dense_tf, "%.1f", dense->tflops);
    std::snprintf(ratio, sizeof ratio, "%.3f", t.tflops / dense->tflops);
  }
  std::printf("%-26s %6s %6s %-22s %8.3f %8.1f %8.1f %9s %8s %7s\n", first ? c.name.c_str() : "",
              first ? std::to_string(c.rows()).c_str() : "",
              first ? std::to_string(offsets.back()).c_str() : "", label.c_str(), t.ms, t.tflops,
              t.tflops_padded, dense_ms, dense_tf, ratio);
}

nlohmann::json timing_json(const Timing& t) {
  return {{"ms", t.ms}, {"tflops", t.tflops}, {"tflops_padded", t.tflops_padded}};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"caracal_gemm_bench: grouped-GEMM forward vs cuBLAS dense GEMM of the same FLOPs"};
  int warmup = 5, reps = 30;
  uint64_t seed = 2026;
  std::string json_path;
  std::vector<std::string> only;
  app.add_option("--warmup", warmup, "untimed runs before timing")->check(CLI::NonNegativeNumber);
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
      const bool ok = std::isfinite(r.check_rel_err) && r.check_rel_err <= 1e-2;
      check_failed |= !ok;
      std::printf("%-26s spot check vs fp64: rel err %.2e %s\n", "", r.check_rel_err,
                  ok ? "ok" : "FAILED");

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
                           {"check_rel_err", r.check_rel_err}};
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
