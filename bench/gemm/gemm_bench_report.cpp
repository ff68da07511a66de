#include "gemm_bench_report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "cutlass_grouped_gemm.hpp"
#include "gemm_bench_cases.hpp"
#include "gemm_bench_cutlass.hpp"

namespace caracal::bench {

namespace {

// One row of the results table: our kernel against its cuBLAS counterpart (none: "-"); the case's
// name and rows on its first row only.
void print_row(const Case& c, const std::vector<int32_t>& offsets, const std::string& label, const Timing& t,
               const Timing* dense, bool first) {
  char dense_ms[32] = "-", dense_tf[32] = "-", ratio[32] = "-";
  if (dense) {
    std::snprintf(dense_ms, sizeof dense_ms, "%.3f", dense->ms);
    std::snprintf(dense_tf, sizeof dense_tf, "%.1f", dense->tflops);
    std::snprintf(ratio, sizeof ratio, "%.3f", t.tflops / dense->tflops);
  }
  // spread: (max - min) / median of the timed runs, in percent.
  std::printf("%-31s %6s %6s %-22s %8.3f %5.1f%% %8.1f %8.1f %9s %8s %7s\n", first ? c.name.c_str() : "",
              first ? std::to_string(c.rows()).c_str() : "",
              first ? std::to_string(offsets.back()).c_str() : "", label.c_str(), t.ms,
              100.0 * (t.max_ms - t.min_ms) / t.ms, t.tflops, t.tflops_padded, dense_ms, dense_tf, ratio);
}

// A line "<what> <measure> <value> ok|FAILED" under the table; false where value is not within 1e-2.
bool print_within_1e2(const char* what, const char* measure, double value) {
  const bool ok = std::isfinite(value) && value <= 1e-2;
  std::printf("%-31s %s %s %.2e %s\n", "", what, measure, value, ok ? "ok" : "FAILED");
  return ok;
}

// A spot check's line; false where it failed.
bool print_check(const char* what, double err) { return print_within_1e2(what, "spot check vs fp64: rel err", err); }

// A baseline's output against ours (the same products, rounded once to bf16 after fp32 sums in
// another order: they differ by about one rounding); false where they disagree.
bool print_agreement(const char* what, double diff) { return print_within_1e2(what, "vs ours: rel diff", diff); }

// The results table's rows in order: the label, our kernel, its cuBLAS counterpart, and for the rows
// not run for every case (CUTLASS's, the FP8 GEMMs') the kernel whose timing says their block ran.
struct RowOf {
  const char* label;
  const char* ours;
  const char* dense;
  const char* if_ran = nullptr;
};
constexpr RowOf kRows[] = {
    {"up+swiglu (+gate_up)", "up_gate_swiglu", "cublas_up"},
    {"up+swiglu (hidden)", "up_gate_swiglu_hidden_only", "cublas_up"},
    {"down", "down", "cublas_down"},
    {"up hidden fixed-stride", "up_gate_swiglu_hidden_only_fixed_stride", "cublas_up"},
    {"down fixed-stride", "down_fixed_stride", "cublas_down"},
    {"forward", "forward", "cublas_forward"},
    {"CUTLASS up coop", "cutlass_cooperative_up", "cublas_up", "cutlass_cooperative_up"},
    {"CUTLASS up pingpong", "cutlass_pingpong_up", "cublas_up", "cutlass_cooperative_up"},
    {"CUTLASS up coop 128x256", "cutlass_cooperative_128x256_up", "cublas_up", "cutlass_cooperative_up"},
    {"CUTLASS down coop", "cutlass_cooperative_down", "cublas_down", "cutlass_cooperative_up"},
    {"CUTLASS down pingpong", "cutlass_pingpong_down", "cublas_down", "cutlass_cooperative_up"},
    {"CUTLASS down coop 128x256", "cutlass_cooperative_128x256_down", "cublas_down", "cutlass_cooperative_up"},
    {"FP8 up+swiglu (+gate_up)", "fp8_up_gate_swiglu", "cublas_up", "fp8_up_gate_swiglu"},
    {"FP8 down", "fp8_down", "cublas_down", "fp8_up_gate_swiglu"},
    {"FP8 forward", "fp8_forward", "cublas_forward", "fp8_up_gate_swiglu"},
    {"FP8 up+swiglu, e4m3 act.", "fp8_up_gate_swiglu_e4m3", "cublas_up", "fp8_up_gate_swiglu"},
    {"FP8 forward, e4m3 act.", "fp8_forward_e4m3", "cublas_forward", "fp8_up_gate_swiglu"},
    {"FP8 activation quantize", "fp8_quantize_activation", "", "fp8_up_gate_swiglu"},
    {"FP8 fwd + act. quantize", "fp8_forward_quantized", "cublas_forward", "fp8_up_gate_swiglu"},
    {"CUTLASS FP8 up", "cutlass_fp8_up", "cublas_up", "fp8_up_gate_swiglu"},
    {"CUTLASS FP8 down", "cutlass_fp8_down", "cublas_down", "fp8_up_gate_swiglu"},
    {"dgrad+swiglu bwd", "dgrad_swiglu", "cublas_dgrad"},
    {"dgrad fixed-stride", "dgrad_swiglu_fixed_stride", "cublas_dgrad"},
    {"CUTLASS dgrad 128x256", "cutlass_cooperative_128x256_dgrad", "cublas_dgrad", "cutlass_cooperative_up"},
    {"CUTLASS dgrad pingpong", "cutlass_pingpong_dgrad", "cublas_dgrad", "cutlass_cooperative_up"},
    {"dx", "dx", "cublas_dx"},
    {"dx fixed-stride", "dx_fixed_stride", "cublas_dx"},
    {"CUTLASS dx 128x256", "cutlass_cooperative_128x256_dx", "cublas_dx", "cutlass_cooperative_up"},
    {"CUTLASS dx pingpong", "cutlass_pingpong_dx", "cublas_dx", "cutlass_cooperative_up"},
    {"FP8 dgrad+swiglu bwd", "fp8_dgrad_swiglu", "cublas_dgrad", "fp8_dgrad_swiglu"},
    {"FP8 dx", "fp8_dx", "cublas_dx", "fp8_dgrad_swiglu"},
    {"wgrad (fp32)", "wgrad", "cublas_wgrad"},
    {"CUTLASS wgrad 128x256", "cutlass_cooperative_128x256_wgrad", "cublas_wgrad", "cutlass_cooperative_up"},
    {"CUTLASS wgrad pingpong", "cutlass_pingpong_wgrad", "cublas_wgrad", "cutlass_cooperative_up"},
    {"FP8 wgrad (fp32)", "fp8_wgrad", "cublas_wgrad", "fp8_dgrad_swiglu"},
    {"FP8 wgrad (bf16)", "fp8_wgrad_bf16", "cublas_wgrad", "fp8_dgrad_swiglu"},
    {"CUTLASS FP8 wgrad coop", "cutlass_fp8_wgrad_cooperative", "cublas_wgrad", "fp8_dgrad_swiglu"},
    {"CUTLASS FP8 wgrad pp", "cutlass_fp8_wgrad_pingpong", "cublas_wgrad", "fp8_dgrad_swiglu"},
    {"FP8 wgrad operands quantize", "fp8_quantize_wgrad_operands", "", "fp8_dgrad_swiglu"},
    {"wgrad (bf16)", "wgrad_bf16", "cublas_wgrad"},
    {"backward", "backward", "cublas_backward"},
};

// Ours against the fastest CUTLASS configuration of the same GEMM (ours: the up kernel that stores
// only the activation, the dgrad with its SwiGLU epilogue; CUTLASS's the plain product).
void print_cutlass_line(const CaseResult& r) {
  const auto best = [&](const char* gemm) {
    double tflops = 0.0;
    for (CutlassSchedule s : kCutlassSchedules) {
      tflops = std::max(tflops, r.timings.at(std::string("cutlass_") + cutlass_schedule_name(s) + "_" + gemm).tflops);
    }
    return tflops;
  };
  const auto best_backward = [&](const char* gemm) {
    double tflops = 0.0;
    for (CutlassBackwardSchedule s : kCutlassBackwardSchedules) {
      tflops = std::max(tflops, r.timings.at("cutlass_" + cutlass_bf16_backward_name(s) + "_" + gemm).tflops);
    }
    return tflops;
  };
  const auto ours = [&](const char* kernel) { return r.timings.at(kernel).tflops; };
  std::printf("%-31s vs CUTLASS's best configuration: up %.3f, down %.3f, dgrad+SwiGLU over the plain product %.3f, "
              "dx %.3f, wgrad %.3f\n",
              "", ours("up_gate_swiglu_hidden_only") / best("up"), ours("down") / best("down"),
              ours("dgrad_swiglu") / best_backward("dgrad"), ours("dx") / best_backward("dx"),
              ours("wgrad") / best_backward("wgrad"));
}

// Our FP8 GEMMs against our bf16 ones (the up kernels both storing gate_up; the dgrads both storing
// bf16 d_gate_up, the FP8 one its e4m3 copy too) and against CUTLASS's blockwise FP8 grouped GEMMs
// (plain product; the weight gradients' faster schedule).
void print_fp8_line(const CaseResult& r) {
  const auto tflops = [&](const char* kernel) { return r.timings.at(kernel).tflops; };
  const double cutlass_wgrad =
      std::max(tflops("cutlass_fp8_wgrad_cooperative"), tflops("cutlass_fp8_wgrad_pingpong"));
  std::printf("%-31s FP8 over our bf16: up %.3f, down %.3f, dgrad %.3f, dx %.3f, wgrad %.3f; over CUTLASS FP8: up %.3f, "
              "down %.3f, wgrad %.3f\n",
              "", tflops("fp8_up_gate_swiglu") / tflops("up_gate_swiglu"), tflops("fp8_down") / tflops("down"),
              tflops("fp8_dgrad_swiglu") / tflops("dgrad_swiglu"), tflops("fp8_dx") / tflops("dx"),
              tflops("fp8_wgrad") / tflops("wgrad"),
              tflops("fp8_up_gate_swiglu") / tflops("cutlass_fp8_up"), tflops("fp8_down") / tflops("cutlass_fp8_down"),
              tflops("fp8_wgrad") / cutlass_wgrad);
  std::printf("%-31s FP8 outputs' digest %016llx\n", "", static_cast<unsigned long long>(r.fp8_output_digest));
}

nlohmann::json timing_json(const Timing& t) {
  return {{"ms", t.ms},
          {"min_ms", t.min_ms},
          {"max_ms", t.max_ms},
          {"tflops", t.tflops},
          {"tflops_padded", t.tflops_padded}};
}

}  // namespace

void print_case_list(const std::vector<Case>& cases) {
  std::printf("%-31s %4s %5s %7s %7s %6s %6s %6s\n", "case", "L", "rank", "rows", "padded", "min", "max", "empty");
  for (const Case& c : cases) {
    const auto [lo, hi] = std::minmax_element(c.counts.begin(), c.counts.end());
    std::printf("%-31s %4d %5d %7lld %7d %6d %6d %6lld\n", c.name.c_str(), c.num_experts, c.rank,
                static_cast<long long>(c.rows()), c.offsets().back(), *lo, *hi,
                static_cast<long long>(std::count(c.counts.begin(), c.counts.end(), 0)));
  }
}

void print_results_header() {
  std::printf("%-31s %6s %6s %-22s %8s %6s %8s %8s %9s %8s %7s\n", "case", "rows", "padded", "kernel", "ms",
              "spread", "TFLOP/s", "padded", "cuBLAS ms", "cuBLAS", "ratio");
}

bool print_case(const Case& c, const CaseResult& r) {
  const std::vector<int32_t> offsets = c.offsets();
  const auto cublas = [&](const char* kernel) -> const Timing* {
    auto it = r.timings.find(kernel);
    return it == r.timings.end() ? nullptr : &it->second;
  };
  bool first = true;  // the case's name and rows on the table's first row only
  for (const RowOf& row : kRows) {
    if (row.if_ran && !r.timings.count(row.if_ran)) continue;
    print_row(c, offsets, row.label, r.timings.at(row.ours), cublas(row.dense), first);
    first = false;
  }
  const bool forward_ok = print_check("forward", r.check_rel_err);
  const bool backward_ok = print_check("backward", r.check_rel_err_backward);
  if (r.cutlass_up_rel_diff < 0.0) return forward_ok && backward_ok;
  print_cutlass_line(r);
  const bool cutlass_ok = print_agreement("CUTLASS up", r.cutlass_up_rel_diff) &&
                          print_agreement("CUTLASS down", r.cutlass_down_rel_diff) &&
                          print_agreement("CUTLASS dx", r.cutlass_dx_rel_diff) &&
                          print_agreement("CUTLASS wgrad", r.cutlass_wgrad_rel_diff);
  bool fp8_ok = true;
  if (r.cutlass_fp8_up_rel_diff >= 0.0) {
    print_fp8_line(r);
    fp8_ok = print_agreement("CUTLASS FP8 up", r.cutlass_fp8_up_rel_diff) &&
             print_agreement("CUTLASS FP8 down", r.cutlass_fp8_down_rel_diff) &&
             print_agreement("CUTLASS FP8 wgrad", r.cutlass_fp8_wgrad_rel_diff);
  }
  return forward_ok && backward_ok && cutlass_ok && fp8_ok;
}

nlohmann::json case_json(const Case& c, const CaseResult& r) {
  nlohmann::json j = {{"name", c.name},
                      {"model", c.model},
                      {"routing", c.routing},
                      {"hidden", c.hidden},
                      {"intermediate", c.intermediate},
                      {"num_experts", c.num_experts},
                      {"top_k", c.top_k},
                      {"tokens_per_rank", c.tokens_per_rank},
                      {"world", c.world},
                      {"rank", c.rank},
                      {"counts", c.counts},
                      {"rows", c.rows()},
                      {"padded_rows", c.offsets().back()},
                      {"check_rel_err", r.check_rel_err},
                      {"check_rel_err_backward", r.check_rel_err_backward}};
  if (r.cutlass_up_rel_diff >= 0.0) {
    j["cutlass_up_rel_diff"] = r.cutlass_up_rel_diff;
    j["cutlass_down_rel_diff"] = r.cutlass_down_rel_diff;
    j["cutlass_dx_rel_diff"] = r.cutlass_dx_rel_diff;
    j["cutlass_wgrad_rel_diff"] = r.cutlass_wgrad_rel_diff;
  }
  if (r.cutlass_fp8_up_rel_diff >= 0.0) {
    j["cutlass_fp8_up_rel_diff"] = r.cutlass_fp8_up_rel_diff;
    j["cutlass_fp8_down_rel_diff"] = r.cutlass_fp8_down_rel_diff;
    j["cutlass_fp8_wgrad_rel_diff"] = r.cutlass_fp8_wgrad_rel_diff;
    char digest[17];
    std::snprintf(digest, sizeof digest, "%016llx", static_cast<unsigned long long>(r.fp8_output_digest));
    j["fp8_output_digest"] = digest;
  }
  for (const auto& [k, t] : r.timings) j["results"][k] = timing_json(t);
  return j;
}

}  // namespace caracal::bench
