#pragma once
// What `caracal bench` prints (the "check" lines) and writes (--json's "validation") for its
// validation: the options validated, per layer and per output the measured error and its bound,
// and plainly what was not validated.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "validation_check.hpp"
#include "validation_plan.hpp"

namespace caracal::bench_tool {

// One validated layer and its check.
struct LayerValidation {
  ValidatedLayer layer;
  int64_t ring_rows = 0;  // the built layer's MoELayer::ring_rows() (0: v1's launches)
  StepCheck check;
};

bool passed(const std::vector<LayerValidation>& results);
// "fused: rank 0 y: ..." of the first output out of bounds; empty when all passed.
std::string first_failure(const std::vector<LayerValidation>& results);

// The plan's not_validated, and for each fused layer that ran over a ring each timed step whose
// macrobatches outnumber the validated step's.
std::vector<std::string> not_validated(const ValidationPlan& plan, const std::vector<LayerValidation>& results);

nlohmann::json validation_json(const ValidationPlan& plan, const std::vector<LayerValidation>& results);
// --no-validate's: nothing was validated.
nlohmann::json skipped_validation_json();

void print_validation(const ValidationPlan& plan, const std::vector<LayerValidation>& results);

}  // namespace caracal::bench_tool
