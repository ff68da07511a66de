#pragma once
// Routing of a whole expert-parallel world: every rank's topk_idx, generated or loaded from a
// trace. This is what the schedule builder, the planner and the tests consume.
//
// Trace file format (.npy): a NumPy array of dtype int32 ('<i4'), C order, shape [W, T, k]:
// topk_idx of every rank; entries are global expert ids in [0, E) or -1 for an empty slot.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace caracal {

struct Routing {
  int64_t world_size = 0;       // W
  int64_t tokens_per_rank = 0;  // T
  int64_t top_k = 0;            // k
  std::vector<int32_t> topk_idx;  // [W][T][k], row-major; -1 = empty slot

  const int32_t* rank_topk(int64_t rank) const { return topk_idx.data() + rank * tokens_per_rank * top_k; }
  int32_t at(int64_t rank, int64_t token, int64_t slot) const {
    return topk_idx[static_cast<size_t>((rank * tokens_per_rank + token) * top_k + slot)];
  }
  // Throws caracal::Error if a size is below 1, W * T * k reaches 2^31 (32-bit route indices),
  // the sizes disagree with topk_idx, or an id is outside [-1, num_experts).
  void validate(int64_t num_experts) const;
};

enum class RoutingKind {
  kUniform,   // each token picks top_k distinct experts uniformly at random
  kZipf,      // distinct experts drawn with popularity ~ 1/rank^exponent (ranks randomly permuted)
  kAllToOne,  // every slot of every token of every rank goes to one expert (the worst case)
};

struct RoutingSpec {
  RoutingKind kind = RoutingKind::kUniform;
  double zipf_exponent = 1.0;   // kZipf: > 0
  int32_t target_expert = 0;    // kAllToOne: the expert receiving everything
  double empty_slot_fraction = 0.0;  // fraction of slots set to -1, in [0, 1]
  uint64_t seed = 0;
};

// Parses "uniform", "zipf" / "zipf:<exponent>", "all-to-one" / "all-to-one:<expert>".
// Throws caracal::Error naming `what` and the accepted forms otherwise.
RoutingSpec parse_routing_spec(const std::string& text, const std::string& what = "routing");
// The text form above, always with its argument ("uniform", "zipf:1.2", "all-to-one:5");
// the seed and the empty-slot fraction are not part of it.
std::string to_string(const RoutingSpec& spec);

// Deterministic for a given spec (seed included) and independent of the standard library:
// std::mt19937_64 with Caracal's own distributions (zipf's weights also use std::log/std::exp).
// Empty slots come from a separate random stream, so raising empty_slot_fraction only blanks
// more slots of the same routing.
Routing make_routing(const RoutingSpec& spec, int64_t world_size, int64_t tokens_per_rank,
                     int64_t top_k, int64_t num_experts);

// Progress: called with (bytes done, bytes total) while reading.
using ProgressFn = std::function<void(int64_t done, int64_t total)>;
// Loads a trace (format above) from a file or a stream that cannot seek (a pipe, a FIFO,
// /dev/stdin). Throws caracal::Error with the path and what is wrong (missing file, not .npy,
// wrong dtype, not 3-D, Fortran order, truncated data, trailing bytes).
Routing load_routing_npy(const std::string& path, const ProgressFn& progress = nullptr);
void save_routing_npy(const Routing& routing, const std::string& path);

}  // namespace caracal
