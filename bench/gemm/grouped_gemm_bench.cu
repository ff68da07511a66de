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
// bench/python/torch_grouped_mm.py.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <fstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "caracal/error.hpp"
#include "cublas_gemm.hpp"
#include "gemm_bench_cases.hpp"
#include "gemm_bench_report.hpp"
#include "gemm_bench_run.hpp"
#include "gemm_bench_support.hpp"

namespace {

using caracal::bench::Case;

struct Options {
  int warmup = 5, reps = 30;
  uint64_t seed = 2026;
  std::string json_path;
  std::vector<std::string> only;
  bool list = false;
  bool no_fp8 = false;
};

void add_options(CLI::App& app, Options& o) {
  app.add_option("--warmup", o.warmup, "untimed runs before timing (at least; and at least 200 ms of them)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--reps", o.reps, "timed runs (median reported)")->check(CLI::Range(1, 100000));
  app.add_option("--seed", o.seed, "routing and data seed");
  app.add_option("--json", o.json_path, "also write every figure (and the cases' counts) as JSON");
  app.add_option("--case", o.only, "run only cases whose name contains this (repeatable)");
  app.add_flag("--list", o.list, "print the cases' row counts and exit (no GPU needed)");
  app.add_flag("--no-fp8", o.no_fp8, "time the bf16 GEMMs and their baselines only (no FP8 rows)");
}

bool selected(const Case& c, const Options& o) {
  return o.only.empty() || std::any_of(o.only.begin(), o.only.end(), [&](const std::string& s) {
           return c.name.find(s) != std::string::npos;
         });
}

cudaDeviceProp hopper_gpu() {
  int device = 0;
  cudaDeviceProp prop{};
  BENCH_CUDA(cudaGetDevice(&device));
  BENCH_CUDA(cudaGetDeviceProperties(&prop, device));
  CARACAL_CHECK(prop.major == 9 && prop.minor == 0, "caracal_gemm_bench needs a Hopper (sm_90) GPU, found ",
                prop.name);
  return prop;
}

// Runs, prints and collects the selected cases; returns 2 where a spot check failed, else 0.
int run(const Options& o) {
  const cudaDeviceProp prop = hopper_gpu();
  const caracal::bench::CublasHandle cublas(nullptr);
  std::printf(
      "caracal_gemm_bench: %s, %d SMs, %.0f MB L2; T=%d tokens/rank, W=%d (unless a case's name "
      "says /wW-tT), median of %d runs after %d warm-up\n",
      prop.name, prop.multiProcessorCount, prop.l2CacheSize / 1e6, caracal::bench::kTokens, caracal::bench::kWorld,
      o.reps, o.warmup);
  caracal::bench::print_results_header();
  nlohmann::json cases_json = nlohmann::json::array();
  bool check_failed = false;
  for (const Case& c : caracal::bench::make_cases(o.seed)) {
    if (!selected(c, o)) continue;
    const caracal::bench::CaseResult r =
        caracal::bench::run_case(c, cublas.get(), o.warmup, o.reps, o.seed, size_t(prop.l2CacheSize), !o.no_fp8);
    check_failed |= !caracal::bench::print_case(c, r);
    cases_json.push_back(caracal::bench::case_json(c, r));
  }
  if (!o.json_path.empty()) {
    nlohmann::json out = {{"device", prop.name}, {"sms", prop.multiProcessorCount},
                          {"warmup", o.warmup},  {"reps", o.reps},
                          {"seed", o.seed},      {"cases", cases_json}};
    std::ofstream f(o.json_path);
    CARACAL_CHECK(bool(f), "cannot write --json ", o.json_path);
    f << out.dump(1) << "\n";
  }
  return check_failed ? 2 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"caracal_gemm_bench: grouped-GEMM forward and backward vs cuBLAS dense GEMM of the same FLOPs"};
  Options o;
  add_options(app, o);
  CLI11_PARSE(app, argc, argv);
  try {
    if (o.list) {
      caracal::bench::print_case_list(caracal::bench::make_cases(o.seed));
      return 0;
    }
    return run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "caracal_gemm_bench: error: %s\n", e.what());
    return 1;
  }
}
