#pragma once
// Readiness between the CTAs of one GPU inside one launch (DESIGN §3: a task waits on local
// counters, never on remote flags): a producer CTA publishes data, then raises a counter; a
// consumer CTA waits until the counter reaches a target, then reads the data. Counters are uint32
// in device memory, only ever raised (fetch_add); a target is compared with wrap-around arithmetic
// (value - target as int32 >= 0), so a counter runs across passes and graph replays without a
// reset while a wait's target is within 2^31 of its value. Device (GPU) scope: data that other
// GPUs write is not covered (that needs world_barrier).
#include <cstdint>

#include <cuda/atomic>

#include "device/comm/device_sync.cuh"
#include "device/comm/device_world.cuh"

namespace caracal::comm {

// Memory order: the producer's __syncthreads orders all its threads' writes before thread 0's
// release add (cumulative); the consumer's thread 0 polls with relaxed loads, acquires once the
// target is reached, and __syncthreads hands that on to the other threads. What a CTA wrote before
// signal_ready is therefore visible to every thread of a CTA after its wait_ready returns true.

// Raises `counter` by `amount` once every thread of the calling CTA has finished its writes. Call
// from all threads of the CTA.
__device__ inline void signal_ready(uint32_t* counter, uint32_t amount = 1) {
  __syncthreads();
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
    cuda::atomic_ref<uint32_t, cuda::thread_scope_device>(*counter).fetch_add(amount, cuda::memory_order_release);
  }
}

// Returns true once `counter` has reached `target` (every thread of the CTA sees the data the
// producers published before raising it), false when the wait timed out or the world is aborted
// (recorded for World::check(), with `index` naming the counter): the CTA must then stop. Call
// from all threads of the CTA; they all get the same result.
__device__ inline bool wait_ready(const DeviceWorld& world, const CtaPlace& place, const uint32_t* counter,
                                  uint32_t target, int index) {
  bool ok = true;
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
    const auto reached = [target](uint32_t v) { return static_cast<int32_t>(v - target) >= 0; };
    ok = wait_until<cuda::thread_scope_device>(world, place, counter, reached, WaitSite{WaitId::ready_counter, index});
  }
  return __syncthreads_and(ok) != 0;
}

// Raises `counter` by `amount` from one thread: a release at device scope, cumulative over what the
// thread has observed, so a warp signals after __syncwarp() and a warpgroup after its named barrier.
__device__ inline void signal_ready_thread(uint32_t* counter, uint32_t amount = 1) {
  cuda::atomic_ref<uint32_t, cuda::thread_scope_device>(*counter).fetch_add(amount, cuda::memory_order_release);
}

// wait_ready for one thread (the others of its CTA go on): true once `counter` has reached `target`,
// false after a timeout or in an aborted world (recorded).
__device__ inline bool wait_ready_thread(const DeviceWorld& world, const CtaPlace& place, const uint32_t* counter,
                                         uint32_t target, int index) {
  const auto reached = [target](uint32_t v) { return static_cast<int32_t>(v - target) >= 0; };
  return wait_until<cuda::thread_scope_device>(world, place, counter, reached, WaitSite{WaitId::ready_counter, index});
}

// Orders this thread's generic-proxy accesses (the flags above, plain loads and stores) with its
// async-proxy ones (TMA loads and stores). A TMA load of data that another CTA published under a
// flag follows the acquire and this fence; a flag raised over data that this thread's TMA stores
// wrote follows their completion (cp.async.bulk.wait_group 0) and this fence.
__device__ inline void async_proxy_fence() { asm volatile("fence.proxy.async.global;" ::: "memory"); }

}  // namespace caracal::comm
