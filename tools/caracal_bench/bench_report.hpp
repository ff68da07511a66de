#pragma once
// What `caracal bench` prints (the table on stdout) and writes (--json): the configuration, the
// validation, and for each tokens-per-rank value the layer's passes against the baselines.
#include <cstdint>
#include <string>

#include <cuda_runtime.h>
#include <nlohmann/json.hpp>

#include "baselines.hpp"
#include "bench_options.hpp"
#include "caracal/layer_config.hpp"
#include "caracal/presets.hpp"
#include "caracal/routing.hpp"

namespace caracal::bench_tool {

// One timed pass of the layer.
struct Pass {
  double ms = 0.0;
  double flops = 0.0;
  double tokens = 0.0;  // per GPU
  double tflops() const { return ms > 0.0 ? flops / (ms * 1e9) : 0.0; }
  double tokens_per_s() const { return ms > 0.0 ? tokens / (ms * 1e-3) : 0.0; }
};

// Everything measured at one tokens-per-rank value.
struct RunResult {
  int64_t tokens_per_rank = 0;
  int64_t tokens_per_gpu = 0;
  bool fp8 = false;              // --precision fp8
  Pass forward, backward, step;  // the fused layer; with fp8 the FP8 layer (on v1's launches)
  double quantize_ms = 0.0;      // with fp8: its weights quantized, once a step (in `step`)
  double step_weights_ready_ms = 0.0;  // with fp8: `step` without it (a step's later micro-batches)
  Pass forward_bf16, backward_bf16, step_bf16;  // with fp8: the bf16 fused layer, same run
  Pass forward_v1, backward_v1, step_v1;  // bf16 MoELayer v1 (separate launches), same run
  std::string v1_skipped;        // why v1 did not run (its buffers do not fit), or empty
  Baseline cublas, nccl;
};

// The JSON's head: the tool, the GPU, the model and layer, the options and the layers' options
// ("layer_options": the fused layer's and v1's, layer_options.hpp).
nlohmann::json config_json(const cudaDeviceProp& prop, int devices, const ModelPreset* preset, const LayerConfig& base,
                           const RoutingSpec& spec, const BenchOptions& a);

// The table's head: the layer, the world, the routing and the timing options.
void print_config(const cudaDeviceProp& prop, const ModelPreset* preset, const LayerConfig& base,
                  const RoutingSpec& spec, const BenchOptions& a);

void print_runs_header();
void print_run(const RunResult& r);
void print_runs_footer(const BenchOptions& a);

nlohmann::json run_json(const RunResult& r);

}  // namespace caracal::bench_tool
