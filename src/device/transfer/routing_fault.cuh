#pragma once
// Device side of routing_fault.hpp: recording an out-of-range expert id.
#include <cstdint>

#include "caracal/comm/first_error.hpp"
#include "caracal/transfer/routing_fault.hpp"

namespace caracal::transfer {

// An id the exchange routes: a global expert in [0, num_experts). -1 is an empty slot; anything
// else is a fault, treated as empty wherever it is read.
__device__ __forceinline__ bool is_routed(int32_t expert, int num_experts) {
  return expert >= 0 && expert < num_experts;
}
__device__ __forceinline__ bool is_valid_slot(int32_t expert, int num_experts) {
  return expert >= -1 && expert < num_experts;
}

// Records that `seen_by` found `expert` at route `route` of `rank`'s topk_idx, unless an earlier
// fault of the period was recorded (caracal/comm/first_error.hpp).
__device__ inline void report_expert_out_of_range(RoutingFaultSink sink, int seen_by, int rank, int route, int top_k,
                                                  int32_t expert, int num_experts) {
  if (!comm::claim_first_error(sink.record, sink.claim)) return;
  volatile RoutingFaultRecord* record = sink.record;
  record->seen_by = seen_by;
  record->rank = rank;
  record->token = route / top_k;
  record->slot = route % top_k;
  record->expert = expert;
  record->num_experts = num_experts;
  comm::publish_first_error(sink.record, static_cast<uint32_t>(RoutingFault::expert_out_of_range));
}

}  // namespace caracal::transfer
