#pragma once
// What a caracal-soak run found, gathered from every thread, printed last and written as --json.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "caracal/layer_config.hpp"
#include "soak_options.hpp"

namespace caracal::soak {

// The stalled attempt of --stall-at's step, before reset() and the step again.
struct StallOutcome {
  int64_t step = -1;
  std::string message;                         // what check() raised; empty: nothing
  std::vector<float> fault_flags;              // per local rank, after the stalled step
  std::vector<float> fault_flags_after_reset;  // per local rank
  uint64_t outputs = 0, poisoned_outputs = 0;  // the stalled path's outputs, those all NaN
  double seconds = 0.0;                        // the stalled step, enqueue to the end of its work
  std::vector<std::string> failures;           // what it did that a stall must not
};

// The error of one output that came nearest its bound over the run (the bounds differ: fp32 and
// bf16 weight gradients), and that bound; a NaN stays.
struct Largest {
  double error = 0.0;
  double bound = 0.0;  // 0: nothing added yet
  void add(double e, double b) {
    if (bound == 0.0 || std::isnan(e) || (!std::isnan(error) && e * bound > error * b)) {
      error = e;
      bound = b;
    }
  }
};

struct Summary {
  int64_t steps = 0;
  uint64_t nonfinite = 0;
  std::vector<std::pair<size_t, size_t>> memory;  // per GPU: used after the warm-up steps, after the last
  double seconds = 0.0;
  int64_t reference_checks = 0;
  std::map<std::string, Largest> reference_errors;  // by output, over every path
  std::map<std::string, uint64_t> bitwise_equal;    // --path both: (step, rank) pairs compared bitwise, by output
  std::map<std::string, Largest> path_errors;       // --path both: v1 against fused where not bitwise, by output
  int64_t replays = 0;                              // --graph: graph launches
  std::optional<StallOutcome> stall;
  std::vector<std::string> failures;  // every check that failed, in order
};

// The summary on stdout, the digest line last; --json's object.
void print_summary(const SoakOptions& a, const LayerConfig& c, const Summary& s, const std::string& digest);
void write_json(const SoakOptions& a, const Summary& s, const std::string& digest);

// Whether nothing failed: no failure recorded, no non-finite output, memory flat.
bool passed(const Summary& s);

}  // namespace caracal::soak
