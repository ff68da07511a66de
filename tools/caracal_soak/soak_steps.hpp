#pragma once
// What each step of caracal-soak runs: its routing (one of five kinds in turn), its weight-gradient
// type (fp32 and bf16 in turn), and whether it is checked against the fp64 reference.
#include <cstdint>

#include "caracal/layer_config.hpp"
#include "caracal/routing.hpp"

namespace caracal::soak {

inline constexpr const char* kKinds[] = {"uniform", "zipf:1.2", "all-to-one", "empty-ranks", "empty-slots"};
inline constexpr int kKindCount = 5;

inline const char* kind_of(int64_t step) { return kKinds[step % kKindCount]; }
inline bool bf16_gradients(int64_t step) { return step % 2 == 1; }

// Step `step`'s routing of the whole world (the same on every rank of the world).
Routing step_routing(const LayerConfig& c, uint64_t seed, int64_t step);

// Whether step `step` is checked against the fp64 reference with --reference-every `every` (0:
// none): one step in each window of `every` steps, at an offset into the window that cycles through
// 0 .. min(every, 10) - 1, so that the checks visit every routing kind with both gradient types
// (each of the 10 pairs in turn when `every` is a multiple of 10) instead of one fixed pair.
bool is_reference_step(int64_t step, int64_t every);

}  // namespace caracal::soak
