#pragma once
// The steps of one host thread's ranks of the world (all of a loopback world's, one NCCL rank): a
// layer per path (soak_options.hpp) on the world, their inputs and outputs, their CUDA graphs.
//
// A step: fresh inputs (seeded by the step: a step run again reads the same ones), forward+backward
// on every path, eager or as the replay of the path's graph for the step's gradient type; then the
// checksum and the non-finite elements of every output of every rank, with --path both v1's outputs
// against fused's (bitwise where the layer documents the same bits, else within the reference
// bounds), check(), and on a reference step every rank's data to the ReferenceGather.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "caracal/comm/cuda_memory.hpp"
#include "caracal/comm/world.hpp"
#include "caracal/layer_config.hpp"
#include "caracal/moe_layer.hpp"
#include "caracal/routing.hpp"
#include "cuda_graph.hpp"
#include "expert_weights.hpp"
#include "soak_gather.hpp"
#include "soak_kernels.hpp"
#include "soak_options.hpp"
#include "soak_reference.hpp"
#include "soak_report.hpp"

namespace caracal::soak {

// --stall-at: the wait timeout during the stalled step, and how late the stalled rank arrives.
inline constexpr std::chrono::milliseconds kStallTimeout{200};
inline constexpr std::chrono::seconds kStallDelay{30};

// The layer options of a path.
MoELayerOptions layer_options(Path path);
// The symmetric heap per rank that every path's layer takes on one world.
size_t heap_bytes(const LayerConfig& c, const std::vector<Path>& paths);

// What one step of this thread's ranks gave.
struct StepResult {
  std::vector<std::pair<std::pair<int, int>, std::string>> lines;  // ((rank, path), checksum line)
  uint64_t nonfinite = 0;
  std::vector<std::string> failures;
  std::map<std::string, uint64_t> bitwise_equal;  // --path both, by output
  std::map<std::string, Largest> path_errors;     // --path both, by output
  std::vector<OutputCheck> reference;             // when this thread ran the step's reference check
  bool graph_replayed = false;
};

class RankRunner {
 public:
  // `gather`: where reference steps' data goes (null: no reference checks).
  RankRunner(comm::World& world, const LayerConfig& c, const SoakOptions& a, ReferenceGather* gather);
  ~RankRunner();
  RankRunner(const RankRunner&) = delete;
  RankRunner& operator=(const RankRunner&) = delete;

  // Step `s` on every path. `reference`: also against the fp64 reference.
  StepResult step(int64_t s, const Routing& routing, bool reference);
  // --stall-at: step `s` on the first path with the last rank stalled past a lowered timeout, what it
  // did, then reset() of every path's layer and the timeout as it was (the caller runs the step again).
  StallOutcome stall(int64_t s, const Routing& routing);

 private:
  struct Inputs;    // one rank's weights and step inputs
  struct PathRank;  // one path's outputs on one rank
  struct PathRun;   // one path's layer, outputs and graphs

  void enqueue_inputs(int64_t s, const Routing& routing);
  // Forward+backward of `p` for step `s`: eager, or its graph's replay (captured at its first use).
  bool enqueue_pass(PathRun& p, int64_t s);
  std::vector<OutputBuffer> outputs(const PathRank& r, bool bf16_grads) const;
  RankStep snapshot(int local, const CheckPlan& plan, bool bf16_grads) const;
  template <typename T>
  std::vector<T> download(const T* device, size_t count) const;

  comm::World& world_;
  LayerConfig c_;
  SoakOptions a_;
  ReferenceGather* gather_;
  cudaStream_t stream_ = nullptr;
  std::vector<Inputs> inputs_;  // [local ranks]
  std::vector<PathRun> paths_;
  comm::DeviceMemory<BufferSums> sums_;               // [paths][local ranks][outputs]
  comm::DeviceMemory<BufferComparison> comparisons_;  // [local ranks][outputs]
};

}  // namespace caracal::soak
