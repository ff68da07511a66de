// caracal-bench: `caracal bench` (issue 5). The `caracal` tool stays host-only (it must plan on a
// machine without a GPU, CUDA driver or NCCL) and execs this binary, which sits next to it, for
// `caracal bench ...`.
//
// 1. Validates the layers it times, with their timed options, weight-gradient precision, graphs,
//    backend and W, against the fp64 reference at a small size of the same shape family, each
//    output within the layer tests' bounds (validation_plan.hpp, bench_validate.hpp,
//    validation_check.hpp), saying what it did not validate, and refuses to time if it fails.
// 2. For each tokens-per-rank value: times forward, backward and forward+backward of the layer
//    (layer_timing.hpp: random weights and inputs, warm-up, the median of CUDA-event-bracketed
//    runs; with --precision fp8 the FP8 layer, then the bf16 fused layer), bf16 v1, and the
//    baselines in the same run (baselines.hpp, bf16):
//      (a) at W = 1: the NCCL host-synchronized exchange (bench/baselines/nccl_baseline_exchange.hpp,
//          dispatch + combine, once per forward and once per backward) + the same grouped GEMMs as
//          the layer (its expert_forward / expert_backward) on the rows the exchange delivered,
//          padded per expert once outside the timed region; timed separately and summed;
//      (b) cuBLAS dense bf16 GEMMs of the layer's shapes and FLOPs (backward: each GEMM twice),
//          the practical roofline.
// FLOPs (DESIGN §1): forward 6*T*k*D*I + 6*T*D*Is per rank, backward twice that; a GPU running a
// loopback world does the work of all W ranks (W*T tokens).
#include <cuda_runtime.h>

#include <algorithm>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "baselines.hpp"
#include "bench_options.hpp"
#include "bench_report.hpp"
#include "bench_rounds.hpp"
#include "bench_validate.hpp"
#include "caracal/comm/cuda_check.hpp"
#include "caracal/comm/loopback_world.hpp"
#include "caracal/comm/nccl_bootstrap.hpp"
#include "caracal/comm/nccl_world.hpp"
#include "caracal/error.hpp"
#include "caracal/layer_config.hpp"
#include "caracal/moe_layer.hpp"
#include "caracal/presets.hpp"
#include "caracal/routing.hpp"
#include "gpu_threads.hpp"
#include "layer_options.hpp"
#include "layer_timing.hpp"
#include "run_command.hpp"
#include "validation_report.hpp"

namespace caracal::bench_tool {

namespace {

// ---- Before the GPU: the options, the configurations and the routing ---------------------------

void check_options(const BenchOptions& a) {
  CARACAL_CHECK(a.precision == "bf16" || a.precision == "fp8", "--precision: expected bf16 or fp8, got '",
                a.precision, "'");
  CARACAL_CHECK(!(a.fp8() && a.profile_step && a.profile_path != "fused"),
                "--profile-path: with --precision fp8, --profile-step profiles the FP8 layer (on v1's launches); "
                "leave --profile-path at fused, got '", a.profile_path, "'");
  CARACAL_CHECK(a.fp8() || a.fp8_weight_grads == "fp8",
                "--fp8-weight-grads: the FP8 layer's option, needs --precision fp8 (got --precision ", a.precision,
                ")");
  CARACAL_CHECK(a.backend == "loopback" || a.backend == "nccl", "--backend: expected loopback or nccl, got '",
                a.backend, "'");
  CARACAL_CHECK(a.warmup >= 0, "--warmup must be >= 0, got ", a.warmup);
  CARACAL_CHECK(a.reps >= 1, "--reps must be >= 1, got ", a.reps);
  CARACAL_CHECK(a.rounds >= 1, "--rounds must be >= 1, got ", a.rounds);
  CARACAL_CHECK(a.ep >= 1 && a.ep <= 64, "--ep must be in [1, 64], got ", a.ep);
}

// The layer of every tokens-per-rank value but the tokens.
LayerConfig base_config(const BenchOptions& a, const ModelPreset* preset) {
  LayerConfig base;
  base.shape = a.shape.shape();
  base.precision = a.fp8() ? Precision::kFP8 : Precision::kBF16;
  if (preset) base.router = preset->router;
  base.ep_size = a.ep;
  return base;
}

// One configuration per tokens-per-rank value (--tokens, or each of --sweep), each checked.
std::vector<LayerConfig> layer_configs(const BenchOptions& a, const LayerConfig& base) {
  const std::vector<int64_t> tokens = a.sweep.empty() ? std::vector<int64_t>{a.tokens} : a.sweep;
  std::vector<LayerConfig> configs;
  for (int64_t t : tokens) {
    CARACAL_CHECK(t > 0, a.sweep.empty() ? "--tokens" : "--sweep", " must be positive, got ", t);
    LayerConfig c = base;
    c.tokens_per_rank = t;
    c.validate();
    const LayerSetup fused = layer_setup(a, true);  // memory() throws for a configuration the layer cannot run
    (void)layer::ExperimentalLayer::memory(c, fused.options, fused.experiments);
    configs.push_back(c);
  }
  return configs;
}

RoutingSpec routing_spec(const BenchOptions& a, const LayerConfig& base) {
  RoutingSpec spec = parse_routing_spec(a.routing, "--routing");
  spec.seed = a.seed;
  if (spec.kind == RoutingKind::kAllToOne) {
    CARACAL_CHECK(spec.target_expert >= 0 && spec.target_expert < base.shape.num_experts, "--routing all-to-one: expert ",
                  spec.target_expert, " outside [0, ", base.shape.num_experts, ")");
  }
  return spec;
}

// ---- The GPU --------------------------------------------------------------------------------------

struct Gpus {
  int count = 0;
  cudaDeviceProp first{};  // GPU 0, a Hopper (sm_90) one
};

Gpus find_gpus(const BenchOptions& a) {
  Gpus g;
  const cudaError_t count_status = cudaGetDeviceCount(&g.count);
  CARACAL_CHECK(count_status == cudaSuccess && g.count > 0, "no GPU: caracal bench needs a Hopper (sm_90) GPU (",
                count_status == cudaSuccess ? std::string("no CUDA device found")
                                            : std::string("cudaGetDeviceCount: ") + cudaGetErrorString(count_status),
                "); `caracal plan` works without one");
  check_cuda(cudaGetDeviceProperties(&g.first, 0), "cudaGetDeviceProperties");
  CARACAL_CHECK(g.first.major == 9 && g.first.minor == 0, "caracal bench needs a Hopper (sm_90) GPU; GPU 0 is ",
                g.first.name, " (sm_", g.first.major, g.first.minor, ")");
  CARACAL_CHECK(!a.nccl() || a.ep <= g.count, "--backend nccl --ep ", a.ep, " needs ", a.ep, " GPUs, found ", g.count,
                " (use the loopback backend for virtual ranks on one GPU)");
  return g;
}

void write_json(const BenchOptions& a, const nlohmann::json& out) {
  if (!a.json.empty()) std::ofstream(a.json) << out.dump(2) << "\n";
}

// ---- 1. Validation ----------------------------------------------------------------------------------

// The layers the timing runs, against the fp64 reference at the small size of the timed family
// (validation_plan.hpp); prints the check lines, and writes `out` with the failed validation and
// throws where an output is out of bounds.
nlohmann::json validate(const std::vector<LayerConfig>& configs, const RoutingSpec& spec, const BenchOptions& a,
                        const Gpus& gpus, nlohmann::json& out) {
  if (a.no_validate) {
    std::cout << "  check   not validated (--no-validate)\n";
    return skipped_validation_json();
  }
  const ValidationPlan plan = plan_validation(a, configs, spec, gpus.first.multiProcessorCount);
  std::vector<LayerValidation> results;
  for (const ValidatedLayer& layer : plan.layers) {
    progress(a, "validating the " + layer.name + " layer against the fp64 reference (D=" +
                    std::to_string(plan.small.shape.hidden) + " I=" + std::to_string(plan.small.shape.intermediate) +
                    " E=" + std::to_string(plan.small.shape.num_experts) +
                    " T=" + std::to_string(plan.small.tokens_per_rank) + ")");
    const ValidationRun run = run_validation_step(plan, layer, a.seed);
    results.push_back({layer, run.rounding.ring_rows,
                       check_step(validated_config(plan, layer), plan.routing, run.ranks, run.rounding,
                                  plan.bf16_weight_grads, validated_bounds(layer))});
  }
  print_validation(plan, results);
  const nlohmann::json validation = validation_json(plan, results);
  if (!passed(results)) {
    out["validation"] = validation;
    write_json(a, out);
    throw Error("validation against the fp64 reference failed (" + first_failure(results) +
                "): not timing; --no-validate skips the check");
  }
  return validation;
}

// ---- 2. One tokens-per-rank value -------------------------------------------------------------------

// The layer over W ranks: a loopback world on GPU 0, one NCCL rank on GPU 0, or one thread per GPU,
// each timing its rank (the slowest rank's times; --profile-step: profile_layer, no times).
LayerTimes time_layer_on_backend(const LayerConfig& c, const Routing& routing, const BenchOptions& a,
                                  bool fused_forward) {
  const int W = int(c.ep_size);
  const LayerSetup setup = layer_setup(a, fused_forward);
  const size_t heap = layer::ExperimentalLayer::memory(c, setup.options, setup.experiments).heap;
  const auto on_world = [&](comm::World& world) {
    if (!a.profile_step) return time_layer(world, c, routing, a, fused_forward);
    profile_layer(world, c, routing, a, fused_forward);
    return LayerTimes{};
  };
  if (!a.nccl()) {
    comm::LoopbackWorld world(W, heap, 0);
    return on_world(world);
  }
  if (W == 1) {
    std::vector<comm::NcclComm> comms = comm::init_all({0});
    comm::NcclWorld world(comms[0].get(), heap);
    return on_world(world);
  }
  // One thread per GPU; each builds its world and layer (collective) and times its rank.
  std::vector<LayerTimes> per_rank(static_cast<size_t>(W));
  cli::on_each_gpu(W, heap, [&](comm::World& world, int rank) { per_rank[size_t(rank)] = on_world(world); });
  LayerTimes t;
  for (const LayerTimes& p : per_rank) {  // the slowest rank
    t.forward = std::max(t.forward, p.forward);
    t.backward = std::max(t.backward, p.backward);
    t.step = std::max(t.step, p.step);
  }
  return t;
}

// The layer of `c` (with --precision fp8 the FP8 one, else the fused one), bf16 v1 and, with
// --precision fp8, the bf16 fused layer, then the baselines, in turn.
RunResult run_one(const LayerConfig& c, const RoutingSpec& spec, const BenchOptions& a) {
  const int W = int(c.ep_size);
  const LayerConfig bf16 = in_bf16(c);
  RunResult r;
  r.fp8 = a.fp8();
  r.tokens_per_rank = c.tokens_per_rank;
  r.tokens_per_gpu = a.nccl() ? c.tokens_per_rank : c.tokens_per_rank * W;
  const Routing routing = make_routing(spec, W, c.tokens_per_rank, c.shape.top_k, c.shape.num_experts);
  // The layer (fused) must fit; v1, whose buffers hold every route of every rank on one, runs where
  // it fits too.
  std::string v1_shortfall;
  for (int d = 0; d < (a.nccl() ? W : 1); ++d) {
    const std::string shortfall = memory_shortfall(c, a, !r.fp8, a.nccl() ? 1 : W, d);
    CARACAL_CHECK(shortfall.empty(), shortfall, ": lower --tokens or --experts");
    if (r.fp8) {  // the bf16 fused layer timed beside it
      const std::string bf16_shortfall = memory_shortfall(bf16, a, true, a.nccl() ? 1 : W, d);
      CARACAL_CHECK(bf16_shortfall.empty(), bf16_shortfall, " (the bf16 fused layer): lower --tokens or --experts");
    }
    if (v1_shortfall.empty()) v1_shortfall = memory_shortfall(bf16, a, false, a.nccl() ? 1 : W, d);
  }

  // The FP8 layer runs v1's launches whatever MoELayerOptions::fused_forward says.
  const LayerTimes t = time_layer_on_backend(c, routing, a, !r.fp8);
  const double fwd_flops = c.shape.forward_flops(r.tokens_per_gpu);
  const double tokens = double(r.tokens_per_gpu);
  r.forward = {t.forward, fwd_flops, tokens};
  r.backward = {t.backward, 2.0 * fwd_flops, tokens};
  r.step = {t.step, 3.0 * fwd_flops, tokens};
  r.quantize_ms = t.quantize;
  r.step_weights_ready_ms = t.step_weights_ready;
  if (r.fp8) {  // the bf16 default path
    const LayerTimes f = time_layer_on_backend(bf16, routing, a, true);
    r.forward_bf16 = {f.forward, fwd_flops, tokens};
    r.backward_bf16 = {f.backward, 2.0 * fwd_flops, tokens};
    r.step_bf16 = {f.step, 3.0 * fwd_flops, tokens};
  }
  // The layer's own previous path, in the same run (a world and layer of its own).
  if (v1_shortfall.empty()) {
    const LayerTimes v1 = time_layer_on_backend(bf16, routing, a, false);
    r.forward_v1 = {v1.forward, fwd_flops, tokens};
    r.backward_v1 = {v1.backward, 2.0 * fwd_flops, tokens};
    r.step_v1 = {v1.step, 3.0 * fwd_flops, tokens};
  } else {
    r.v1_skipped = "does not fit: " + v1_shortfall;
    progress(a, "T=" + std::to_string(c.tokens_per_rank) + ": v1 skipped, it " + r.v1_skipped);
  }

  progress(a, "T=" + std::to_string(c.tokens_per_rank) + ": cuBLAS dense baseline");
  r.cublas = time_cublas(bf16, r.tokens_per_gpu, a, 0);
  if (W == 1) progress(a, "T=" + std::to_string(c.tokens_per_rank) + ": NCCL exchange + grouped-GEMM baseline");
  r.nccl = time_nccl_baseline(bf16, routing, a, 0);
  return r;
}

int run(const BenchOptions& a) {
  // Everything checkable without a GPU first.
  check_options(a);
  const ModelPreset* preset = a.shape.preset();
  const LayerConfig base = base_config(a, preset);
  const std::vector<LayerConfig> configs = layer_configs(a, base);
  const RoutingSpec spec = routing_spec(a, base);

  const Gpus gpus = find_gpus(a);
  nlohmann::json out = config_json(gpus.first, gpus.count, preset, base, spec, a);
  print_config(gpus.first, preset, base, spec, a);
  out["validation"] = validate(configs, spec, a, gpus, out);

  if (a.profile_step) {  // no timing: one step of the layer per token count, for a profiler
    const bool fused = a.profile_path == "fused" && !a.fp8();
    for (const LayerConfig& c : configs) {
      const Routing routing =
          make_routing(spec, c.ep_size, c.tokens_per_rank, c.shape.top_k, c.shape.num_experts);
      (void)time_layer_on_backend(c, routing, a, fused);
      std::cout << "  profiled T=" << c.tokens_per_rank << ": one forward and backward of the "
                << (a.fp8() ? "FP8 layer" : fused ? "fused layer" : "v1 layer")
                << " between cudaProfilerStart and cudaProfilerStop\n";
    }
    out["profiled"] = true;
    write_json(a, out);
    return 0;
  }
  print_runs_header();
  nlohmann::json runs = nlohmann::json::array();
  for (const LayerConfig& c : configs) {
    progress(a, "T=" + std::to_string(c.tokens_per_rank) + ": timing the layer (warm-up " + std::to_string(a.warmup) +
                    ", " + std::to_string(a.reps) + " runs per pass)");
    std::vector<RunResult> rounds;
    for (int round = 0; round < a.rounds; ++round) {
      if (a.rounds > 1) progress(a, "round " + std::to_string(round + 1) + " of " + std::to_string(a.rounds));
      rounds.push_back(run_one(c, spec, a));
    }
    const RunResult r = median_of_rounds(rounds);
    print_run(r);
    nlohmann::json run = run_json(r);
    if (a.rounds > 1) {
      const RoundRatios ratios = over_gemms_alone_by_round(rounds);
      print_round_ratios(ratios);
      nlohmann::json each = nlohmann::json::array();
      for (const RunResult& round : rounds) each.push_back(run_json(round));
      run["rounds"] = each;
      run["forward_over_gemms_alone_by_round"] = ratios.forward;
      run["backward_over_gemms_alone_by_round"] = ratios.backward;
    }
    runs.push_back(run);
    out["runs"] = runs;
    write_json(a, out);  // partial results survive a later failure
  }
  print_runs_footer(a);
  if (!a.json.empty()) {
    std::ofstream f(a.json);
    CARACAL_CHECK(static_cast<bool>(f), "--json: cannot write '", a.json, "'");
    f << out.dump(2) << "\n";
    CARACAL_CHECK(static_cast<bool>(f), "--json: failed writing '", a.json, "'");
  }
  return 0;
}

void add_options(CLI::App& app, BenchOptions& a) {
  cli::add_shape_options(app, a.shape);
  app.add_option("--ep", a.ep, "W: expert-parallel degree")->capture_default_str();
  app.add_option("--backend", a.backend, "loopback (W virtual ranks on GPU 0) | nccl (one GPU per rank)")
      ->capture_default_str();
  app.add_option("--tokens", a.tokens, "T: tokens per rank")->capture_default_str();
  app.add_option("--sweep", a.sweep, "Tokens per rank to sweep, comma-separated (replaces --tokens)")
      ->delimiter(',');
  app.add_option("--routing", a.routing, "uniform | zipf[:exponent] | all-to-one[:expert]")->capture_default_str();
  app.add_option("--seed", a.seed, "Seed of the routing and the data")->capture_default_str();
  app.add_option("--precision", a.precision,
                 "bf16 | fp8 (fp8: the FP8 layer timed, DeepSeek-V3's block-scaled e4m3 on v1's launches, beside the "
                 "bf16 fused layer and bf16 v1)")
      ->capture_default_str();
  app.add_option("--warmup", a.warmup, "Untimed runs per pass (at least; and at least 200 ms of them)")->capture_default_str();
  app.add_option("--reps", a.reps, "Timed runs per pass (the median is reported)")->capture_default_str();
  app.add_option("--rounds", a.rounds,
                 "Time the layer, v1 and the baselines in turn this many times; report each figure's median over "
                 "the rounds (and ours over the GEMMs alone round by round)")
      ->capture_default_str();
  app.add_option("--json", a.json, "Write every result as JSON to this path");
  app.add_flag("--no-validate", a.no_validate,
               "Skip the fp64-reference check of the timed layers before timing (the output then says: not validated)");
  app.add_flag("--quiet", a.quiet, "No progress lines on stderr");
  app.add_option("--exchange-sms", a.exchange_sms, "SMs the token exchange may occupy (0: all but 16)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--fused-comm-ctas", a.fused_comm_ctas, "Pulling CTAs per rank in the fused forward (0: default)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_flag("--fused-pull-all-rows", a.fused_pull_all_rows,
               "Experiment: the fused passes pull the rows of tokens on this GPU too (one GPU then runs their pull "
               "roles)");
  app.add_flag("--bf16-weight-grads", a.bf16_weight_grads,
               "Weight gradients in bf16 (as the PyTorch module gives bf16 weights), the layer's and the GEMMs-alone "
               "baseline's (and the fp64-reference check's); default fp32");
  app.add_option("--fp8-weight-grads", a.fp8_weight_grads,
                 "With --precision fp8: the FP8 layer's weight gradients by FP8 GEMMs on rows quantized down their "
                 "columns (fp8), or by the bf16 GEMMs on the bf16 rows (bf16; MoELayerOptions::fp8_weight_gradients)")
      ->check(CLI::IsMember({"fp8", "bf16"}))
      ->capture_default_str();
  app.add_flag("--rows-per-route", a.rows_per_route,
               "Experiment: move a row per route both ways, not one per (token, rank): pulls read a token per route, "
               "combine pushes each route's row");
  app.add_flag("--dx-rows-per-route", a.dx_rows_per_route,
               "Experiment: at W > 1 the fused backward sends a dx row home per route instead of one sum per "
               "(token, rank)");
  app.add_flag("--fused-fp8-forward", a.fused_fp8_forward,
               "Experiment: with --precision fp8, the forward in one fused launch (one macrobatch; at W > 1 every "
               "row pulled)");
  app.add_flag("--fused-fp8-backward", a.fused_fp8_backward,
               "Experiment: with --precision fp8 (and FP8 weight gradients), the backward's dgrad and dx in one "
               "fused launch");
  app.add_flag("--profile-step", a.profile_step,
               "No timing: after two warm-up steps, one forward and backward of the layer (FP8: its weights "
               "quantized once first, as a step does) between cudaProfilerStart and cudaProfilerStop (ncu "
               "--profile-from-start off; scripts/kernel-times.sh)");
  app.add_option("--profile-path", a.profile_path, "The layer --profile-step runs: the fused path or v1's launches")
      ->check(CLI::IsMember({"fused", "v1"}))
      ->capture_default_str();
  app.add_flag("--graph", a.graph,
               "Time replays of CUDA graphs captured from the layer's calls (no host work in the timed runs)");
  app.add_option("--ring-rows", a.ring_rows,
                 "Rows of the fused forward's ring, a multiple of 128 (0: a balanced step in one macrobatch)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
}

}  // namespace

}  // namespace caracal::bench_tool

int main(int argc, char** argv) {
  caracal::bench_tool::BenchOptions a;
  CLI::App app{"caracal bench: time MoELayer forward/backward on the GPU against the NCCL-exchange and cuBLAS baselines",
               "caracal bench"};
  caracal::bench_tool::add_options(app, a);
  return caracal::cli::parse_and_run(app, argc, argv, "bench: ", "caracal bench --help",
                                     [&] { return caracal::bench_tool::run(a); });
}
