#include "shape_options.hpp"

#include "caracal/error.hpp"

namespace caracal::cli {

const ModelPreset* ShapeOptions::preset() const {
  return model.empty() ? nullptr : &find_model_preset(model);
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
