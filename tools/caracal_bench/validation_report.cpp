#include "validation_report.hpp"

#include <cmath>
#include <cstdio>
#include <iostream>

#include "layer_options.hpp"

namespace caracal::bench_tool {

namespace {

// A measure as JSON: null where it is not finite (NaN, or an output whose reference is 0).
nlohmann::json number(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

nlohmann::json output_json(const OutputCheck& o, const checks::LayerBounds& bounds) {
  nlohmann::json error = nlohmann::json::object(), bound = nlohmann::json::object();
  for (const Measure& m : o.measures) {
    error[m.name] = number(m.error);
    bound[m.name] = m.bound;
  }
  nlohmann::json j = {{"output", o.output}, {"row", o.row},       {"passed", o.passed()},
                      {"error", error},     {"bound", bound},     {"worst_rank", o.worst_rank}};
  if (o.output == "d_topk_scores") {
    j["note"] = "per slot |got - want| <= " + fmt("%.0e", bounds.score_rel) + " |want| + " + fmt("%.0e", bounds.score_abs) +
                " B_t (B_t bounds the token's |dg|); error: the worst slot's |got - want| over that";
  }
  if (!o.passed()) j["failures"] = o.failures;
  return j;
}

nlohmann::json ring_json(const LayerValidation& r) {
  nlohmann::json timed = nlohmann::json::array();
  for (const TimedRing& t : r.layer.timed) {
    timed.push_back({{"tokens_per_rank", t.tokens}, {"rows", t.rows}, {"macrobatches", t.macrobatches}});
  }
  if (r.ring_rows == 0) return {{"option", r.layer.ring.option}, {"rows", 0}, {"how", "no ring: the layer runs v1's launches at this W"}};
  return {{"option", r.layer.ring.option},
          {"rows", r.ring_rows},
          {"macrobatches", r.layer.ring.macrobatches},
          {"how", r.layer.ring.how},
          {"timed", timed}};
}

std::string ring_text(const LayerValidation& r) {
  if (r.ring_rows == 0) return "no ring (v1's launches)";
  std::string text = "ring " + std::to_string(r.ring_rows) + " rows (" + r.layer.ring.how + "): " +
                     std::to_string(r.layer.ring.macrobatches) + " macrobatches; timed";
  for (const TimedRing& t : r.layer.timed) {
    text += " T=" + std::to_string(t.tokens) + ": " + std::to_string(t.rows) + " rows, " +
            std::to_string(t.macrobatches) + " macrobatches;";
  }
  text.pop_back();
  return text;
}

}  // namespace

bool passed(const std::vector<LayerValidation>& results) {
  for (const LayerValidation& r : results) {
    if (!r.check.passed()) return false;
  }
  return true;
}

std::string first_failure(const std::vector<LayerValidation>& results) {
  for (const LayerValidation& r : results) {
    if (!r.check.passed()) return r.layer.name + ": " + r.check.first_failure();
  }
  return "";
}

std::vector<std::string> not_validated(const ValidationPlan& plan, const std::vector<LayerValidation>& results) {
  std::vector<std::string> out = plan.not_validated;
  for (const LayerValidation& r : results) {
    if (r.ring_rows == 0) continue;  // no ring: v1's launches
    for (const TimedRing& t : r.layer.timed) {
      if (t.macrobatches <= r.layer.ring.macrobatches) continue;
      out.push_back(r.layer.name + " layer, T=" + std::to_string(t.tokens) + ": the timed step's " +
                    std::to_string(t.macrobatches) + " macrobatches (a ring of " + std::to_string(t.rows) +
                    " rows); the validated step has " + std::to_string(r.layer.ring.macrobatches) +
                    ", the most it can have");
    }
  }
  return out;
}

nlohmann::json validation_json(const ValidationPlan& plan, const std::vector<LayerValidation>& results) {
  const LayerConfig& small = plan.small;
  nlohmann::json layers = nlohmann::json::array();
  for (const LayerValidation& r : results) {
    nlohmann::json outputs = nlohmann::json::array();
    for (const OutputCheck& o : r.check.outputs) outputs.push_back(output_json(o, validated_bounds(r.layer)));
    nlohmann::json layer = {{"layer", r.layer.name},
                            {"precision", to_string(r.layer.precision)},
                            {"passed", r.check.passed()},
                            {"options", setup_json(r.layer.setup)},
                            {"timed_options", setup_json(r.layer.timed_setup)},
                            {"outputs", outputs}};
    if (r.layer.name == "fused") layer["ring"] = ring_json(r);
    layers.push_back(layer);
  }
  nlohmann::json v = {{"ran", true}, {"passed", passed(results)}};
  v["backend"] = plan.backend;
  v["ep"] = small.ep_size;
  v["routing"] = to_string(plan.spec);
  v["weight_grads"] = plan.bf16_weight_grads ? "bf16" : "fp32";
  v["graph"] = plan.graph;
  v["config"] = {{"hidden", small.shape.hidden},
                 {"intermediate", small.shape.intermediate},
                 {"experts", small.shape.num_experts},
                 {"top_k", small.shape.top_k},
                 {"shared_intermediate", small.shape.shared_intermediate},
                 {"ep", small.ep_size},
                 {"tokens_per_rank", small.tokens_per_rank}};
  v["layers"] = layers;
  v["not_validated"] = not_validated(plan, results);
  if (!passed(results)) v["first_failure"] = first_failure(results);
  return v;
}

nlohmann::json skipped_validation_json() {
  return {{"ran", false}, {"passed", false}, {"not_validated", {"everything: --no-validate skipped the check"}}};
}

void print_validation(const ValidationPlan& plan, const std::vector<LayerValidation>& results) {
  const LayerConfig& s = plan.small;
  std::cout << "  check   fp64 reference at D=" << s.shape.hidden << " I=" << s.shape.intermediate
            << " E=" << s.shape.num_experts << " k=" << s.shape.top_k << " T=" << s.tokens_per_rank << " W=" << s.ep_size
            << " (" << plan.backend << "), " << (plan.bf16_weight_grads ? "bf16" : "fp32") << " weight gradients"
            << (plan.graph ? ", through CUDA graph replays" : "") << ": " << (passed(results) ? "passed" : "FAILED")
            << "\n";
  for (const LayerValidation& r : results) {
    std::cout << "          " << r.layer.name
              << (r.layer.precision == Precision::kFP8 ? " (against the unquantized layer's reference)" : "") << ", "
              << ring_text(r) << ": " << (r.check.passed() ? "passed" : "FAILED") << "\n";
    for (const OutputCheck& o : r.check.outputs) {
      char head[64];
      std::snprintf(head, sizeof head, "            %-16s", o.output.c_str());
      std::string line = head;
      for (const Measure& m : o.measures) {
        line += " " + m.name + " " + fmt("%.2e", m.error) + " <= " + fmt("%.2e", m.bound) + ",";
      }
      line.pop_back();
      line += " (rows: " + o.row + ")" + (o.passed() ? "" : "  FAILED: " + o.failures.front());
      std::cout << line << "\n";
    }
  }
  for (const std::string& n : not_validated(plan, results)) std::cout << "          not validated: " << n << "\n";
  std::cout << std::flush;
}

}  // namespace caracal::bench_tool
