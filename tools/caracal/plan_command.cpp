// `caracal plan`: builds the schedule for a shape, EP degree, tokens per rank and routing, and
// prints traffic, overlap granularity, memory and roofline times (see include/caracal/plan.hpp).
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include "caracal/error.hpp"
#include "caracal/plan.hpp"
#include "caracal/presets.hpp"
#include "caracal/routing.hpp"
#include "commands.hpp"
#include "shape_options.hpp"
#include "plan_report.hpp"

namespace caracal::cli {

namespace {

struct PlanArgs {
  ShapeOptions shape;
  int64_t ep = 1;
  bool ep_given = false;  // --ep on the command line (a trace sets W otherwise)
  bool tflops_given = false;  // --tflops on the command line (else the precision's default_plan_tflops)
  int64_t tokens = 0;
  std::string routing = "uniform";
  std::string trace;
  double empty_slots = 0.0;
  uint64_t seed = 1;
  std::string precision = "bf16";
  std::string tile = "128x256";
  PlanOptions options;
  bool json = false;
  bool quiet = false;
};

// "128x256" -> (128, 256).
std::pair<int64_t, int64_t> parse_tile(const std::string& text) {
  const auto x = text.find('x');
  CARACAL_CHECK(x != std::string::npos, "tile: expected <rows>x<cols> such as 128x256, got '", text, "'");
  try {
    size_t used_m = 0, used_n = 0;
    const long long m = std::stoll(text.substr(0, x), &used_m);
    const long long n = std::stoll(text.substr(x + 1), &used_n);
    CARACAL_CHECK(used_m == x && used_n == text.size() - x - 1 && m > 0 && n > 0,
                  "tile: expected positive <rows>x<cols> such as 128x256, got '", text, "'");
    return {m, n};
  } catch (const std::logic_error&) {
    throw Error("tile: expected <rows>x<cols> such as 128x256, got '" + text + "'");
  }
}

// Progress on stderr for long traces, so stdout stays clean for --json.
ProgressFn trace_progress(bool quiet) {
  if (quiet) return nullptr;
  auto last_percent = std::make_shared<int>(-1);
  return [last_percent](int64_t done, int64_t total) {
    if (total < (64 << 20)) return;
    const int percent = static_cast<int>(100 * done / total);
    if (percent / 10 == *last_percent / 10 && percent != 100) return;
    *last_percent = percent;
    std::cerr << "\rcaracal plan: reading trace " << percent << "%" << (percent == 100 ? "\n" : "")
              << std::flush;
  };
}

int run_plan(const PlanArgs& a) {
  const ModelPreset* preset = a.shape.preset();
  LayerConfig config;
  config.shape = a.shape.shape();
  config.precision = parse_precision(a.precision, "--precision");
  if (preset) config.router = preset->router;

  PlanOptions options = a.options;
  if (!a.tflops_given) options.tflops = default_plan_tflops(config.precision);
  std::tie(options.tile_m, options.tile_n) = parse_tile(a.tile);
  options.validate();  // before a trace is read or a routing made

  Routing routing;
  std::string source;
  if (!a.trace.empty()) {
    routing = load_routing_npy(a.trace, trace_progress(a.quiet || a.json));
    source = "trace:" + a.trace;
    config.ep_size = routing.world_size;
    config.tokens_per_rank = routing.tokens_per_rank;
    CARACAL_CHECK(!a.ep_given || a.ep == routing.world_size, "--ep ", a.ep, " does not match the trace's W = ",
                  routing.world_size, " (", a.trace, ")");
    CARACAL_CHECK(a.tokens == 0 || a.tokens == routing.tokens_per_rank, "--tokens ", a.tokens,
                  " does not match the trace's T = ", routing.tokens_per_rank, " (", a.trace, ")");
    CARACAL_CHECK(routing.top_k == config.shape.top_k, "trace ", a.trace, ": top-k ", routing.top_k,
                  " does not match the layer's top_k = ", config.shape.top_k);
    config.validate();
    routing.validate(config.shape.num_experts);
  } else {
    CARACAL_CHECK(a.tokens > 0, "--tokens is required (tokens per rank, > 0) unless --trace is given");
    config.ep_size = a.ep;
    config.tokens_per_rank = a.tokens;
    config.validate();
    RoutingSpec spec = parse_routing_spec(a.routing, "--routing");
    spec.empty_slot_fraction = a.empty_slots;
    spec.seed = a.seed;
    routing = make_routing(spec, config.ep_size, config.tokens_per_rank, config.shape.top_k,
                           config.shape.num_experts);
    source = to_string(spec) + " (seed " + std::to_string(spec.seed) +
             (spec.empty_slot_fraction > 0 ? ", empty slots " + std::to_string(spec.empty_slot_fraction) : "") + ")";
  }

  const Plan plan = make_plan(config, routing, source, options);
  if (a.json) {
    std::cout << plan_to_json(plan, preset).dump(2) << "\n";
  } else {
    print_plan_table(std::cout, plan, preset);
  }
  return 0;
}

}  // namespace

Runner add_plan_command(CLI::App& app) {
  auto args = std::make_shared<PlanArgs>();
  CLI::App* cmd = app.add_subcommand("plan", "Plan a layer: traffic, overlap granularity, memory, roofline");
  add_shape_options(*cmd, args->shape);
  CLI::Option* ep = cmd->add_option("--ep", args->ep, "W: expert-parallel degree (ranks)");
  ep->capture_default_str();
  cmd->add_option("--tokens", args->tokens, "T: tokens per rank");
  cmd->add_option("--routing", args->routing, "uniform | zipf[:exponent] | all-to-one[:expert]")
      ->capture_default_str();
  cmd->add_option("--trace", args->trace,
                  "Routing trace: .npy int32 [W, T, k] of global expert ids, -1 = empty slot");
  cmd->add_option("--empty-slots", args->empty_slots, "Fraction of slots set to -1 (generated routing)")
      ->capture_default_str();
  cmd->add_option("--seed", args->seed, "Seed of the generated routing")->capture_default_str();
  cmd->add_option("--precision", args->precision, "bf16 | fp8")->capture_default_str();
  cmd->add_option("--sms", args->options.sm_count, "SMs per GPU, in [1, 1024]")->capture_default_str();
  cmd->add_option("--tile", args->tile, "GEMM tile MxN, each side in [1, 1024]")->capture_default_str();
  CLI::Option* tflops = cmd->add_option(
      "--tflops", args->options.tflops,
      "Matrix rate for the compute time (default: dense cuBLAS on an H200, 806 for bf16, 1135 for fp8)");
  cmd->add_option("--nvlink-gbs", args->options.nvlink_gbs, "NVLink GB/s per direction")
      ->capture_default_str();
  cmd->add_option("--ring-rows", args->options.ring_rows,
                  "Ring rows (a multiple of the minibatch); 0 = fit a balanced step")
      ->capture_default_str();
  cmd->add_flag("--fp32-weight-grads", [args](int64_t) { args->options.bf16_weight_gradients = false; },
                "The layer gives fp32 weight gradients only (MoELayerOptions::bf16_weight_gradients = false): no "
                "partial sums for bf16 ones");
  cmd->add_flag("--json", args->json, "Print the plan as JSON");
  cmd->add_flag("--quiet", args->quiet, "No progress output");
  return [args, ep, tflops] {
    args->ep_given = ep->count() > 0;
    args->tflops_given = tflops->count() > 0;
    return run_plan(*args);
  };
}

}  // namespace caracal::cli
