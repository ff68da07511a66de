#pragma once
// Renders a Plan as a readable table or as JSON.
#include <iosfwd>

#include <nlohmann/json.hpp>

#include "caracal/plan.hpp"
#include "caracal/presets.hpp"

namespace caracal::cli {

void print_plan_table(std::ostream& os, const Plan& plan, const ModelPreset* preset);
nlohmann::json plan_to_json(const Plan& plan, const ModelPreset* preset);

}  // namespace caracal::cli
