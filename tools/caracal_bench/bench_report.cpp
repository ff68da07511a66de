#include "bench_report.hpp"

#include <cstdio>
#include <iostream>

#include "layer_options.hpp"

namespace caracal::bench_tool {

namespace {

nlohmann::json pass_json(const Pass& p) {
  return {{"ms", p.ms}, {"tflops", p.tflops()}, {"tokens_per_s", p.tokens_per_s()}};
}

nlohmann::json baseline_json(const Baseline& b, const RunResult& r) {
  if (!b.available) return {{"available", false}, {"note", b.note}};
  nlohmann::json j = {{"available", true},
                      {"note", b.note},
                      {"forward_ms", b.forward_ms},
                      {"backward_ms", b.backward_ms},
                      {"fwd_bwd_ms", b.step_ms()},
                      {"ratio_forward", b.forward_ms / r.forward.ms},
                      {"ratio_backward", b.backward_ms / r.backward.ms},
                      {"ratio_fwd_bwd", b.step_ms() / r.step.ms}};
  if (b.exchange_ms > 0.0) {
    // The baseline's GEMMs alone: the time the layer's own tiles take without any data movement,
    // against which the fused passes are held (issues 14 and 15: ours / GEMMs alone <= 1.05).
    // They are bf16's: the ratios are the bf16 fused layer's.
    const Pass& fwd = r.fp8 ? r.forward_bf16 : r.forward;
    const Pass& bwd = r.fp8 ? r.backward_bf16 : r.backward;
    j["exchange_ms"] = b.exchange_ms;
    j["gemms_alone_forward_ms"] = b.forward_ms - b.exchange_ms;
    j["gemms_alone_backward_ms"] = b.backward_ms - b.exchange_ms;
    j["forward_over_gemms_alone"] = fwd.ms / (b.forward_ms - b.exchange_ms);
    j["backward_over_gemms_alone"] = bwd.ms / (b.backward_ms - b.exchange_ms);
  }
  return j;
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

void print_pass(const RunResult& r, const char* name, const Pass& p, double cublas_ms, double nccl_ms) {
  std::string line = "  ";
  char head[64];
  std::snprintf(head, sizeof head, "%-8lld %-13s", static_cast<long long>(r.tokens_per_rank), name);
  line += head;
  line += fmt("%10.3f", p.ms) + fmt("%9.1f", p.tflops()) + fmt("%10.2f", p.tokens_per_s() * 1e-6);
  line += fmt("%11.3f", cublas_ms) + fmt("%8.2fx", cublas_ms / p.ms);
  if (r.nccl.available) {
    line += fmt("%12.3f", nccl_ms) + fmt("%8.2fx", nccl_ms / p.ms);
  } else {
    line += "           -        -";
  }
  std::cout << line << "\n";
}

}  // namespace

nlohmann::json config_json(const cudaDeviceProp& prop, int devices, const ModelPreset* preset, const LayerConfig& base,
                           const RoutingSpec& spec, const BenchOptions& a) {
  nlohmann::json out;
  out["tool"] = "caracal bench";
  out["device"] = {{"name", prop.name}, {"sms", prop.multiProcessorCount}, {"count", devices}};
  out["model"] = preset ? nlohmann::json(preset->name) : nlohmann::json(nullptr);
  out["layer"] = {{"hidden", base.shape.hidden},
                  {"intermediate", base.shape.intermediate},
                  {"experts", base.shape.num_experts},
                  {"local_experts", base.local_experts()},
                  {"top_k", base.shape.top_k},
                  {"shared_experts", base.shape.num_shared_experts},
                  {"shared_intermediate", base.shape.shared_intermediate},
                  {"router", {{"normalize", base.router.normalize}, {"scale", base.router.scale}}}};
  out["ep"] = a.ep;
  out["backend"] = a.backend;
  out["routing"] = to_string(spec);
  out["seed"] = a.seed;
  out["precision"] = a.precision;  // fp8: "runs" time the FP8 layer, "bf16_fused" the bf16 one
  // The shared expert's GEMMs run in the layer's precision (an FP8 layer's in FP8 since 3fb4d8e).
  out["layer"]["shared_precision"] = a.precision;
  out["warmup"] = a.warmup;
  out["reps"] = a.reps;
  out["rounds"] = a.rounds;  // each figure the median over the rounds (bench_rounds.hpp)
  out["exchange_sms"] = a.exchange_sms;  // 0: the default (all but 16)
  out["fused_comm_ctas"] = a.fused_comm_ctas;  // 0: the default
  out["fused_pull_all_rows"] = a.fused_pull_all_rows;
  out["weight_grads"] = a.bf16_weight_grads ? "bf16" : "fp32";
  out["rows_per_route"] = a.rows_per_route;
  out["dx_rows_per_route"] = a.dx_rows_per_route;
  out["ring_rows"] = a.ring_rows;  // 0: the default (a balanced step in one macrobatch)
  out["graph"] = a.graph;  // timed as CUDA-graph replays
  out["profile_step"] = a.profile_step;  // no timing: one step for a profiler
  out["profile_path"] = a.profile_path;
  out["layer_options"] = {{"fused", setup_json(layer_setup(a, true))}, {"v1", setup_json(layer_setup(a, false))}};
  if (a.fp8()) out["layer_options"]["fp8"] = setup_json(layer_setup(a, false));
  out["flops_note"] =
      "forward 6*T*k*D*I + 6*T*D*Is per rank, backward 2x; a loopback GPU runs all W ranks (W*T tokens)";
  return out;
}

void print_config(const cudaDeviceProp& prop, const ModelPreset* preset, const LayerConfig& base,
                  const RoutingSpec& spec, const BenchOptions& a) {
  std::cout << "Caracal bench: " << (preset ? preset->description + " (" + preset->name + ")" : std::string("custom shape"))
            << ", " << a.precision << ", " << prop.name << " (" << prop.multiProcessorCount << " SMs)\n";
  std::cout << "  layer   D=" << base.shape.hidden << " I=" << base.shape.intermediate << " E=" << base.shape.num_experts
            << " k=" << base.shape.top_k << ", shared I=" << base.shape.shared_intermediate << "\n";
  std::cout << "  world   EP=" << a.ep << " " << a.backend << " (" << base.local_experts() << " experts per rank"
            << (a.nccl() ? ", one GPU per rank" : ", all ranks on GPU 0") << "), routing " << to_string(spec)
            << ", warm-up " << a.warmup << ", median of " << a.reps << "\n";
}

void print_runs_header() {
  std::cout << "\n  T/rank   pass                ms  TFLOP/s  Mtok/s   cuBLAS ms  speedup   NCCL+GEMMs  speedup\n";
  std::cout << std::flush;
}

void print_run(const RunResult& r) {
  print_pass(r, r.fp8 ? "forward fp8" : "forward", r.forward, r.cublas.forward_ms, r.nccl.forward_ms);
  print_pass(r, r.fp8 ? "backward fp8" : "backward", r.backward, r.cublas.backward_ms, r.nccl.backward_ms);
  print_pass(r, r.fp8 ? "fwd+bwd fp8" : "fwd+bwd", r.step, r.cublas.step_ms(), r.nccl.step_ms());
  if (r.fp8) {
    std::cout << "  " << std::string(23, ' ') << "the weights quantized: " << fmt("%.3f", r.quantize_ms)
              << " ms (once a step: in fp8 fwd+bwd, not in forward or backward alone)\n";
    std::cout << "  " << std::string(23, ' ') << "fp8 fwd+bwd on weights quantized before (a step's later "
              << "micro-batches): " << fmt("%.3f", r.step_weights_ready_ms) << " ms\n";
    print_pass(r, "forward bf16", r.forward_bf16, r.cublas.forward_ms, r.nccl.forward_ms);
    print_pass(r, "backward bf16", r.backward_bf16, r.cublas.backward_ms, r.nccl.backward_ms);
    print_pass(r, "fwd+bwd bf16", r.step_bf16, r.cublas.step_ms(), r.nccl.step_ms());
    std::cout << "  " << std::string(23, ' ') << "fp8 over bf16 (fused): forward "
              << fmt("%.3f", r.forward_bf16.ms / r.forward.ms) << "x, backward "
              << fmt("%.3f", r.backward_bf16.ms / r.backward.ms) << "x, fwd+bwd " << fmt("%.3f", r.step_bf16.ms / r.step.ms)
              << "x\n";
  }
  if (r.nccl.available && r.nccl.exchange_ms > 0.0) {
    const Pass& fwd = r.fp8 ? r.forward_bf16 : r.forward;
    const Pass& bwd = r.fp8 ? r.backward_bf16 : r.backward;
    const double forward_gemms = r.nccl.forward_ms - r.nccl.exchange_ms;
    const double backward_gemms = r.nccl.backward_ms - r.nccl.exchange_ms;
    std::cout << "  " << std::string(23, ' ') << (r.fp8 ? "bf16 " : "") << "over the GEMMs alone ("
              << fmt("%.3f", forward_gemms) << " and " << fmt("%.3f", backward_gemms) << " ms): forward "
              << fmt("%.3f", fwd.ms / forward_gemms) << "x, backward " << fmt("%.3f", bwd.ms / backward_gemms) << "x\n";
  }
  if (r.v1_skipped.empty()) {
    if (r.fp8) {
      std::cout << "  " << std::string(23, ' ') << "fp8 over bf16 v1 (the same launches): forward "
                << fmt("%.3f", r.forward_v1.ms / r.forward.ms) << "x, backward "
                << fmt("%.3f", r.backward_v1.ms / r.backward.ms) << "x, fwd+bwd "
                << fmt("%.3f", r.step_v1.ms / r.step.ms) << "x\n";
    }
    print_pass(r, "forward v1", r.forward_v1, r.cublas.forward_ms, r.nccl.forward_ms);
    print_pass(r, "backward v1", r.backward_v1, r.cublas.backward_ms, r.nccl.backward_ms);
    print_pass(r, "fwd+bwd v1", r.step_v1, r.cublas.step_ms(), r.nccl.step_ms());
  } else {
    char head[32];
    std::snprintf(head, sizeof head, "  %-8lld ", static_cast<long long>(r.tokens_per_rank));
    std::cout << head << "v1 skipped: it " << r.v1_skipped << "\n";
  }
  std::cout << std::flush;
}

void print_runs_footer(const BenchOptions& a) {
  std::cout << "\n  ms: median of " << a.reps << " device-event-timed runs"
            << (a.rounds > 1 ? ", then the median over " + std::to_string(a.rounds) + " rounds (each layer and baseline in turn)"
                             : std::string())
            << "; TFLOP/s and Mtok/s per GPU"
            << (a.nccl() ? "" : " (the GPU runs all W ranks: W*T tokens)")
            << "; speedup = baseline ms / ours.\n"
            << (a.fp8() ? "  fp8: the FP8 layer (DeepSeek-V3's block-scaled e4m3 on v1's launches); bf16: the fused\n"
                          "  layer (default); v1: bf16 MoELayer v1's separate launches; cuBLAS and the GEMMs bf16; same run.\n"
                        : "  forward, fwd+bwd: the fused forward (default); v1: MoELayer v1's separate launches, same run.\n")
            << "  NCCL+GEMMs: host-synchronized NCCL exchange + the layer's grouped GEMMs on the rows it delivered\n"
            << "  (padded once, untimed), timed apart and summed (W = 1 only); its GEMMs alone are what the\n"
            << "  fused passes are held to (the data movement hidden: ours / GEMMs alone close to 1).\n";
}

nlohmann::json run_json(const RunResult& r) {
  return {{"tokens_per_rank", r.tokens_per_rank},
          {"tokens_per_gpu", r.tokens_per_gpu},
          {"forward", pass_json(r.forward)},
          {"backward", pass_json(r.backward)},
          {"fwd_bwd", pass_json(r.step)},
          {"forward_path", r.fp8 ? "fp8 (v1's launches)" : "fused"},
          {"fp8_weight_quantization_ms", r.fp8 ? nlohmann::json(r.quantize_ms) : nlohmann::json(nullptr)},
          // fwd_bwd without the weights' quantization: a step's micro-batches after its first
          {"fp8_fwd_bwd_weights_ready_ms", r.fp8 ? nlohmann::json(r.step_weights_ready_ms) : nlohmann::json(nullptr)},
          {"v1", r.v1_skipped.empty()
                     ? nlohmann::json{{"forward", pass_json(r.forward_v1)},
                                      {"backward", pass_json(r.backward_v1)},
                                      {"fwd_bwd", pass_json(r.step_v1)}}
                     : nlohmann::json{{"skipped", r.v1_skipped}}},
          {"bf16_fused", r.fp8 ? nlohmann::json{{"forward", pass_json(r.forward_bf16)},
                                                {"backward", pass_json(r.backward_bf16)},
                                                {"fwd_bwd", pass_json(r.step_bf16)}}
                               : nlohmann::json(nullptr)},
          {"baselines",
           {{"cublas_dense", baseline_json(r.cublas, r)}, {"nccl_exchange_plus_gemms", baseline_json(r.nccl, r)}}}};
}

}  // namespace caracal::bench_tool
