#pragma once
// Model presets: the MoE layer shapes of DESIGN §1 with each model's router settings.
#include <string>
#include <vector>

#include "caracal/layer_config.hpp"

namespace caracal {

struct ModelPreset {
  std::string name;         // CLI name, e.g. "deepseek-v3"
  std::string description;  // human-readable model name
  LayerShape shape;
  RouterNormalization router;
  bool shared_output_gate = false;  // the framework scales the shared expert's output per token
  // Why Caracal's layer cannot run this model's experts (empty: it can). `caracal plan` and
  // `caracal bench` refuse such a preset with this reason; `caracal models` lists it.
  std::string unsupported;
};

const std::vector<ModelPreset>& model_presets();
// Throws caracal::Error listing the known names if `name` is not one of them.
const ModelPreset& find_model_preset(const std::string& name);
// "deepseek-v3, kimi-k2, ..." for messages and --help.
std::string model_preset_names();

}  // namespace caracal
