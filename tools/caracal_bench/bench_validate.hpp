#pragma once
// caracal bench, step 1 on the GPU: one forward and one backward of a layer the validation runs
// (validation_plan.hpp), as the timing runs it, downloaded for the check against the fp64
// reference (validation_check.hpp).
#include <cstdint>
#include <vector>

#include "layer_reference_options.hpp"
#include "validation_check.hpp"
#include "validation_plan.hpp"

namespace caracal::bench_tool {

struct ValidationRun {
  std::vector<RankStep> ranks;     // [W]
  checks::LayerRounding rounding;  // how the layer built rounds its sums (its ring_rows(), groups_dx_rows())
};

// One step of a fresh layer of plan.small built with `layer.options`, on the plan's backend (a
// loopback world of W ranks on GPU 0, or one NCCL rank per GPU, a thread each), with weights and
// inputs from `seed` as the timing makes them (layer_inputs.hpp), the weight gradients in the
// plan's precision. With plan.graph, after one eager step, a CUDA graph captured from the step is
// replayed twice, every output poisoned (NaN) before each replay: the second replay's outputs are
// returned. Throws caracal::Error for CUDA failures or a device fault MoELayer::check reports.
ValidationRun run_validation_step(const ValidationPlan& plan, const ValidatedLayer& layer, uint64_t seed);

}  // namespace caracal::bench_tool
