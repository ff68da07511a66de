#pragma once
// The layer-shape options shared by `caracal plan` and `caracal bench`: a model preset, each of
// whose dimensions an explicit option may override, or a fully explicit shape.
#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

#include "caracal/layer_config.hpp"
#include "caracal/presets.hpp"

namespace caracal::cli {

struct ShapeOptions {
  std::string model;
  int64_t hidden = 0, intermediate = 0, experts = 0, top_k = 0;
  int64_t shared_intermediate = -1;  // -1: the preset's; 0: no shared expert

  // The preset named by --model, or nullptr; throws caracal::Error for an unknown name and for a
  // preset whose experts the layer cannot run (ModelPreset::unsupported), naming why.
  const ModelPreset* preset() const;
  // The preset's shape with the explicit options applied; throws caracal::Error when neither a
  // preset nor all of --hidden, --intermediate, --experts and --top-k are given.
  LayerShape shape() const;
};

void add_shape_options(CLI::App& app, ShapeOptions& options);

}  // namespace caracal::cli
