#include "soak_steps.hpp"

#include <algorithm>

namespace caracal::soak {

Routing step_routing(const LayerConfig& c, uint64_t seed, int64_t step) {
  RoutingSpec spec;
  spec.seed = seed * 7919 + static_cast<uint64_t>(step);
  const int kind = static_cast<int>(step % kKindCount);
  if (kind == 1) {
    spec.kind = RoutingKind::kZipf;
    spec.zipf_exponent = 1.2;
  } else if (kind == 2) {
    spec.kind = RoutingKind::kAllToOne;
    spec.target_expert = static_cast<int32_t>(step % c.shape.num_experts);
  } else if (kind == 4) {
    spec.empty_slot_fraction = 0.3;
  }
  Routing r = make_routing(spec, c.ep_size, c.tokens_per_rank, c.shape.top_k, c.shape.num_experts);
  if (kind == 3) {  // every route to rank 0's experts (-1 stays -1)
    for (int32_t& id : r.topk_idx) id %= static_cast<int32_t>(c.local_experts());
  }
  return r;
}

bool is_reference_step(int64_t step, int64_t every) {
  if (every <= 0 || step < 0) return false;
  const int64_t window = step / every;
  return step % every == window % std::min<int64_t>(every, 10);
}

}  // namespace caracal::soak
