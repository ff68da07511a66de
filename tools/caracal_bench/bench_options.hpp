#pragma once
// The command line of `caracal bench`, and its progress lines on stderr.
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include "shape_options.hpp"

namespace caracal::bench_tool {

struct BenchOptions {
  cli::ShapeOptions shape;
  int64_t ep = 1;
  std::string backend = "loopback";
  int64_t tokens = 4096;
  std::vector<int64_t> sweep;
  std::string routing = "uniform";
  uint64_t seed = 1;
  std::string precision = "bf16";
  int warmup = 5;
  int reps = 20;
  int rounds = 1;  // the layer and the baselines timed in turn, this many times (bench_rounds.hpp)
  std::string json;
  bool no_validate = false;
  bool quiet = false;
  int exchange_sms = 0;     // MoELayerOptions::exchange_sms
  int fused_comm_ctas = 0;  // MoELayerOptions::fused_comm_ctas
  bool fused_pull_all_rows = false;  // layer::LayerExperiments::pull_all_rows
  bool rows_per_route = false;       // layer::LayerExperiments::rows_per_route
  bool dx_rows_per_route = false;    // layer::LayerExperiments::dx_rows_per_route
  bool fused_fp8_forward = false;    // layer::LayerExperiments::fused_fp8_forward
  bool fused_fp8_backward = false;   // layer::LayerExperiments::fused_fp8_backward
  int ring_rows = 0;        // MoELayerOptions::ring_rows
  bool graph = false;       // time replays of CUDA graphs captured from the layer's calls
  bool profile_step = false;  // no timing: one forward and backward for a profiler (profile_layer)
  std::string profile_path = "fused";  // the layer --profile-step runs: "fused" or "v1"
  bool bf16_weight_grads = false;  // the weight gradients in bf16 (the PyTorch module's for bf16 weights)
  std::string fp8_weight_grads = "fp8";  // MoELayerOptions::fp8_weight_gradients ("fp8") or not ("bf16")

  bool nccl() const { return backend == "nccl"; }
  // --precision fp8: the timed layer is the FP8 one (LayerConfig::precision kFP8), the bf16 fused
  // layer and bf16 v1 beside it.
  bool fp8() const { return precision == "fp8"; }
};

inline void progress(const BenchOptions& a, const std::string& line) {
  if (!a.quiet) std::cerr << "caracal bench: " << line << std::endl;
}

}  // namespace caracal::bench_tool
