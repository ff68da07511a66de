#include "shape_options.hpp"

#include <string>

#include "caracal/error.hpp"

namespace caracal::cli {

namespace {

// "--hidden 2880 --intermediate 2880 ...": the options that give `s` without a preset.
std::string explicit_shape_options(const LayerShape& s) {
  return "--hidden " + std::to_string(s.hidden) + " --intermediate " + std::to_string(s.intermediate) +
         " --experts " + std::to_string(s.num_experts) + " --top-k " + std::to_string(s.top_k) +
         " --shared-intermediate " + std::to_string(s.shared_intermediate);
}

}  // namespace

const ModelPreset* ShapeOptions::preset() const {
  if (model.empty()) return nullptr;
  const ModelPreset& p = find_model_preset(model);
  CARACAL_CHECK(p.unsupported.empty(), "--model ", p.name, ": not supported: ", p.unsupported,
                "; its shape alone, with Caracal's plain SwiGLU: ", explicit_shape_options(p.shape));
  return &p;
}

LayerShape ShapeOptions::shape() const {
  const ModelPreset* p = preset();
  LayerShape s = p ? p->shape : LayerShape{};
  if (hidden) s.hidden = hidden;
  if (intermediate) s.intermediate = intermediate;
  if (experts) s.num_experts = experts;
  if (top_k) s.top_k = top_k;
  if (shared_intermediate >= 0) {
    s.shared_intermediate = shared_intermediate;
    s.num_shared_experts = shared_intermediate > 0 ? 1 : 0;
  }
  CARACAL_CHECK(s.hidden && s.intermediate && s.num_experts && s.top_k,
                "shape: give --model NAME or all of --hidden, --intermediate, --experts, --top-k");
  return s;
}

void add_shape_options(CLI::App& app, ShapeOptions& o) {
  app.add_option("--model", o.model, "Model preset (" + model_preset_names() + ")");
  app.add_option("--hidden", o.hidden, "D: hidden size, in [1, 65536] (overrides the preset)");
  app.add_option("--intermediate", o.intermediate, "I: routed expert intermediate size, in [1, 65536]");
  app.add_option("--experts", o.experts, "E: number of routed experts, in [1, 65536] (global; E/W per rank)");
  app.add_option("--top-k", o.top_k, "k: routed experts per token");
  app.add_option("--shared-intermediate", o.shared_intermediate, "I of the shared expert; 0 = no shared expert");
}

}  // namespace caracal::cli
