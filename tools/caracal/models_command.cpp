// `caracal models`: the model presets, as a table or (--json) one object per preset; presets whose
// experts the layer cannot run are marked, with the reason plan and bench refuse them for.
#include <cstdio>
#include <iostream>
#include <memory>

#include <nlohmann/json.hpp>

#include "caracal/presets.hpp"
#include "commands.hpp"

namespace caracal::cli {

namespace {

nlohmann::json preset_json(const ModelPreset& p) {
  nlohmann::json j = {{"name", p.name},
                      {"description", p.description},
                      {"hidden", p.shape.hidden},
                      {"intermediate", p.shape.intermediate},
                      {"experts", p.shape.num_experts},
                      {"top_k", p.shape.top_k},
                      {"shared_intermediate", p.shape.shared_intermediate},
                      {"router", {{"normalize", p.router.normalize}, {"scale", p.router.scale}}},
                      {"shared_output_gate", p.shared_output_gate},
                      {"supported", p.unsupported.empty()}};
  if (!p.unsupported.empty()) j["unsupported"] = p.unsupported;
  return j;
}

void print_table() {
  std::cout << "name              D      I      E    k   shared I  model\n";
  for (const ModelPreset& p : model_presets()) {
    char line[200];
    std::snprintf(line, sizeof line, "%-16s %5lld  %5lld  %4lld  %3lld  %8lld  %s%s\n", p.name.c_str(),
                  static_cast<long long>(p.shape.hidden), static_cast<long long>(p.shape.intermediate),
                  static_cast<long long>(p.shape.num_experts), static_cast<long long>(p.shape.top_k),
                  static_cast<long long>(p.shape.shared_intermediate), p.description.c_str(),
                  p.unsupported.empty() ? "" : " (not supported: below)");
    std::cout << line;
  }
  for (const ModelPreset& p : model_presets())
    if (!p.unsupported.empty()) std::cout << "\n" << p.name << ": plan and bench refuse it: " << p.unsupported << "\n";
}

}  // namespace

Runner add_models_command(CLI::App& app) {
  auto json = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand("models", "List the model presets");
  cmd->add_flag("--json", *json, "Print the presets as JSON");
  return [json] {
    if (!*json) {
      print_table();
      return 0;
    }
    nlohmann::json presets = nlohmann::json::array();
    for (const ModelPreset& p : model_presets()) presets.push_back(preset_json(p));
    std::cout << nlohmann::json{{"presets", presets}}.dump(2) << "\n";
    return 0;
  };
}

}  // namespace caracal::cli
