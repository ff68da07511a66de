#include "caracal/transfer/routing_fault.hpp"

#include <atomic>

#include "caracal/comm/cuda_check.hpp"
#include "caracal/error.hpp"

namespace caracal::transfer {

RoutingFaultFlag::RoutingFaultFlag()
    : host_record_(comm::pinned_mapped_alloc<RoutingFaultRecord>(1, "cudaHostAlloc(routing fault record)")),
      claim_(comm::device_alloc<unsigned>(1, "cudaMalloc(routing fault claim)")) {
  *host_record_ = RoutingFaultRecord{};
  void* mapped = nullptr;
  check_cuda(cudaHostGetDevicePointer(&mapped, host_record_.get(), 0),
             "cudaHostGetDevicePointer(routing fault record)");
  device_record_ = static_cast<RoutingFaultRecord*>(mapped);
  check_cuda(cudaMemset(claim_.get(), 0, sizeof(unsigned)), "cudaMemset(routing fault claim)");
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize(routing fault setup)");
}

void RoutingFaultFlag::check() {
  // The device writes the fields, fences, then `fault`: read in the opposite order.
  volatile RoutingFaultRecord* shared = host_record_.get();
  const uint32_t fault = shared->fault;
  if (fault == static_cast<uint32_t>(RoutingFault::none)) return;
  std::atomic_thread_fence(std::memory_order_acquire);
  const int32_t seen_by = shared->seen_by;
  const int32_t rank = shared->rank;
  const int32_t token = shared->token;
  const int32_t slot = shared->slot;
  const int32_t expert = shared->expert;
  const int32_t num_experts = shared->num_experts;
  shared->seen_by = 0;
  shared->rank = 0;
  shared->token = 0;
  shared->slot = 0;
  shared->expert = 0;
  shared->num_experts = 0;
  shared->fault = 0;
  // Open the next period only once the record is empty (see the header).
  std::atomic_thread_fence(std::memory_order_seq_cst);
  shared->cleared = shared->cleared + 1;
  throw Error(caracal::detail::concat(
      "TokenExchange: topk_idx of rank ", rank, " holds expert id ", expert, " at [token ", token, "][slot ", slot,
      "], outside [-1, num_experts=", num_experts, ") (found by rank ", seen_by,
      "'s schedule builder). Every rank treats such a slot as empty, so this schedule and "
      "the transfers that used it are invalid."));
}

}  // namespace caracal::transfer
