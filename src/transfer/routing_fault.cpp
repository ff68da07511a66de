#include "caracal/transfer/routing_fault.hpp"

#include "caracal/error.hpp"

namespace caracal::transfer {

RoutingFaultFlag::RoutingFaultFlag() : channel_("routing fault") {}

void RoutingFaultFlag::check() {
  RoutingFaultRecord fault{};
  if (!channel_.take(fault)) return;
  const int32_t seen_by = fault.seen_by, rank = fault.rank, token = fault.token, slot = fault.slot;
  const int32_t expert = fault.expert, num_experts = fault.num_experts;
  throw Error(caracal::detail::concat(
      "TokenExchange: topk_idx of rank ", rank, " holds expert id ", expert, " at [token ", token, "][slot ", slot,
      "], outside [-1, num_experts=", num_experts, ") (found by rank ", seen_by,
      "'s schedule builder). Every rank treats such a slot as empty, so this schedule and "
      "the transfers that used it are invalid."));
}

}  // namespace caracal::transfer
