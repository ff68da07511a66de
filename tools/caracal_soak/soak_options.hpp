#pragma once
// The command line of caracal-soak: its options, their checks (before anything touches a GPU) and
// the layer configuration they describe.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "caracal/layer_config.hpp"

namespace caracal::soak {

// Which of the layer's paths a step runs (MoELayerOptions::fused_forward).
enum class Path { fused, v1 };
const char* name_of(Path p);

struct SoakOptions {
  int64_t ep = 4;
  std::string backend = "loopback";
  int64_t steps = 1000;
  int64_t hidden = 1024, intermediate = 512, experts_per_rank = 8, top_k = 4, shared_intermediate = 512;
  int64_t tokens = 512;
  uint64_t seed = 1;
  std::string checksums, json;
  int64_t reference_every = 50;  // 0: no fp64 reference checks (soak_steps.hpp: which steps)
  bool graph = false;            // replay a captured forward+backward per gradient type
  std::string path = "fused";    // fused | v1 | both
  int64_t stall_at = -1;         // -1: no stall

  bool nccl() const { return backend == "nccl"; }
  bool stalls() const { return stall_at >= 0; }
  // The paths each step runs, in order: the first is the one whose checksums a single-path run
  // writes, the one the stall hits and the one the other is compared with.
  std::vector<Path> paths() const;
};

void add_soak_options(CLI::App& app, SoakOptions& options);

// Throws caracal::Error naming the first bad option, its value and what is expected: the
// combinations the parser cannot see (--stall-at with --backend nccl, a step outside the run, ...)
// and the layer's shape (LayerConfig::validate).
void check_soak_options(const SoakOptions& options);

// The layer the options describe (every rank's).
LayerConfig soak_config(const SoakOptions& options);

}  // namespace caracal::soak
