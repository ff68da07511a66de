#pragma once
// The first-error channel: how device code reports a failure to the host without synchronizing
// (a timed-out wait, an out-of-range expert id). One record per channel lives in pinned,
// host-mapped memory; the host reads it at its next check().
//
// Protocol (periods): a record type R has a `uint32_t tag` (0 = empty; written last) and a
// `uint32_t cleared` (errors the host has taken; written by the host only), plus its fields.
//   device: claim_first_error() CASes a device word from `cleared` to cleared + 1 (atomics on
//           mapped host memory are not relied upon): only the first error of a period wins; the
//           winner writes the fields, then publish_first_error() fences and writes the tag;
//   host:   take_first_error() reads the tag first, copies the record, zeroes it, and only then
//           bumps `cleared`, which opens the next period (a later error finds the record empty).
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>

#include "caracal/comm/cuda_check.hpp"
#include "caracal/comm/cuda_memory.hpp"

#if defined(__CUDACC__)
#include <cuda/atomic>
#endif

namespace caracal::comm {

#if defined(__CUDACC__)
// True for the first error of the current period: the caller then fills the record's fields and
// calls publish_first_error.
template <typename R>
__device__ inline bool claim_first_error(R* record, unsigned* claim) {
  const uint32_t period =
      cuda::atomic_ref<uint32_t, cuda::thread_scope_system>(record->cleared).load(cuda::memory_order_acquire);
  return atomicCAS(claim, period, period + 1) == period;
}

// The fields written before, then the tag that makes the record visible to the host.
template <typename R>
__device__ inline void publish_first_error(R* record, uint32_t tag) {
  __threadfence_system();
  static_cast<volatile R*>(record)->tag = tag;
}
#endif

// Copies a published record into `out` and opens the next period (true), or false if the record
// is empty. Host only; one host thread per channel.
template <typename R>
bool take_first_error(R* shared, R& out) {
  if (static_cast<volatile R*>(shared)->tag == 0) return false;
  std::atomic_thread_fence(std::memory_order_acquire);
  std::memcpy(&out, shared, sizeof(R));  // stable: no device writes until `cleared` moves on
  const uint32_t cleared = out.cleared;
  R empty{};  // tag 0, fields 0, `cleared` as it was
  empty.cleared = cleared;
  std::memcpy(static_cast<void*>(shared), &empty, sizeof(R));
  std::atomic_thread_fence(std::memory_order_seq_cst);
  static_cast<volatile R*>(shared)->cleared = cleared + 1;
  return true;
}

// Owns one channel: the pinned record (zeroed), its device address and the device claim word.
// Construction synchronizes the device (setup only). Not copyable.
template <typename R>
class FirstErrorChannel {
 public:
  explicit FirstErrorChannel(const std::string& what)
      : host_(pinned_mapped_alloc<R>(1, ("cudaHostAlloc(" + what + " record)").c_str())),
        claim_(device_alloc<unsigned>(1, ("cudaMalloc(" + what + " claim)").c_str())) {
    *host_ = R{};
    void* mapped = nullptr;
    check_cuda(cudaHostGetDevicePointer(&mapped, host_.get(), 0), ("cudaHostGetDevicePointer(" + what + ")").c_str());
    device_ = static_cast<R*>(mapped);
    check_cuda(cudaMemset(claim_.get(), 0, sizeof(unsigned)), ("cudaMemset(" + what + " claim)").c_str());
    check_cuda(cudaDeviceSynchronize(), ("cudaDeviceSynchronize(" + what + " setup)").c_str());
  }

  R* device_record() const { return device_; }  // what device code writes
  unsigned* device_claim() const { return claim_.get(); }
  // take_first_error on the record: the published error, if any, into `out`.
  bool take(R& out) { return take_first_error(host_.get(), out); }

 private:
  PinnedMemory<R> host_;
  R* device_ = nullptr;
  DeviceMemory<unsigned> claim_;
};

}  // namespace caracal::comm
