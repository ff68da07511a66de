#pragma once
// Bounded waits and the world barrier (DESIGN §3: cross-rank ordering comes only from barriers;
// every spin is bounded):
//   wait_until(world, place, flag, done, site)        one thread spins until done(*flag); acquire
//   world_barrier(world, place)                       every CTA of a role of every rank, all threads
//   fail_wait(world, rank, site, seen, timeout_ns)    what a timed-out wait does
//   global_time_ns()                                   %globaltimer, the clock of every timeout
// Both return false after a timeout or an abort (uniformly per CTA): the kernel must then return.
// The first wait to expire records its error and aborts the world (every rank's abort word), so
// every other wait ends at once and every later launch stops at its first barrier until
// World::reset(). Timeout and generation are read from WorldControl when a wait runs (graph
// replays follow set_wait_timeout and reset). One launch at a time per world uses the barrier
// state (stream order). docs/ARCHITECTURE.md, "Communication blocks", says why not NCCL's barrier.
#include <cstdint>

#include <cuda/atomic>

#include "caracal/comm/first_error.hpp"
#include "device/comm/barrier_layout.hpp"
#include "device/comm/cta_place.cuh"
#include "device/comm/device_world.cuh"

namespace caracal::comm {

// Nanoseconds of the GPU's global timer (the same clock on every SM).
__device__ __forceinline__ uint64_t global_time_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// The barrier state (barrier_layout.hpp) sits at heap offset 0 of every rank.
__device__ __forceinline__ uint32_t* barrier_state(const DeviceWorld& world, int rank) {
  return world.at(SymmetricPtr<uint32_t>{0}, rank);
}

// 0 while the world is healthy, else 1 + the rank that aborted it, as `rank` sees it (relaxed,
// system scope).
__device__ __forceinline__ uint32_t world_abort_word(const DeviceWorld& world, int rank) {
  return cuda::atomic_ref<uint32_t, cuda::thread_scope_system>(barrier_state(world, rank)[barrier_layout::kAbort])
      .load(cuda::memory_order_relaxed);
}

// Records that `site` failed with its flag at `seen` after `timeout_ns`, unless an earlier error
// of the period was recorded (first_error.hpp).
__device__ inline void record_wait_failure(const DeviceWorld& world, int rank, WaitSite site, uint64_t seen,
                                           uint64_t timeout_ns) {
  if (!claim_first_error(world.error, world.error_claim)) return;
  volatile DeviceErrorRecord* record = world.error;
  record->rank = rank;
  record->peer = site.peer;
  record->launch = world.launch_id;
  record->seen = seen;
  record->timeout_ns = timeout_ns;
  record->launch_name = world.launch_name;
  record->generation = world.generation();
  publish_first_error(world.error, static_cast<uint32_t>(site.wait));
}

// What a wait does when its time is up: record the error, then abort the world (see the top).
// Every rank's abort word gets 1 + this rank, so later waits anywhere end at once, and its fault
// flag 1.0f.
__device__ inline void fail_wait(const DeviceWorld& world, int rank, WaitSite site, uint64_t seen,
                                 uint64_t timeout_ns) {
  record_wait_failure(world, rank, site, seen, timeout_ns);
  __threadfence_system();  // the record before the abort that makes other ranks stop
  const auto mark = static_cast<uint32_t>(rank + 1);
  for (int p = 0; p < world.world_size; ++p) {
    uint32_t* state = barrier_state(world, p);
    cuda::atomic_ref<uint32_t, cuda::thread_scope_system>(state[barrier_layout::kFault])
        .store(__float_as_uint(1.0f), cuda::memory_order_relaxed);
    cuda::atomic_ref<uint32_t, cuda::thread_scope_system>(state[barrier_layout::kAbort])
        .store(mark, cuda::memory_order_relaxed);
  }
}

// A wait of `rank` that found the world aborted by rank `abort_word - 1`: recorded, nothing else
// to do.
__device__ inline void record_world_aborted(const DeviceWorld& world, int rank, uint32_t abort_word) {
  record_wait_failure(world, rank, WaitSite{WaitId::world_aborted, static_cast<int>(abort_word) - 1}, abort_word, 0);
}

namespace detail {

// Polls *flag with relaxed loads at `Scope` until done(value) holds (true), `timeouts` times the
// world's timeout has passed since `start` (fail_wait, false) or the world is aborted (recorded,
// false). The flag is read at least once, so an expired deadline still succeeds when the condition
// already holds; the timeout is read only when the first read fails. No acquire: callers add the
// fence they need.
template <cuda::thread_scope Scope, typename T, typename Done>
__device__ bool spin_until(const DeviceWorld& world, int rank, const T* flag, Done done, WaitSite site,
                           uint32_t timeouts, uint64_t start) {
  cuda::atomic_ref<T, Scope> ref(*const_cast<T*>(flag));
  T value = ref.load(cuda::memory_order_relaxed);
  if (done(value)) return true;
  const uint64_t timeout_ns = timeouts * world.timeout_ns();
  for (;;) {
    value = ref.load(cuda::memory_order_relaxed);
    if (done(value)) return true;
    if (const uint32_t aborted = world_abort_word(world, rank); aborted != 0) {
      record_world_aborted(world, rank, aborted);
      return false;
    }
    if (global_time_ns() - start >= timeout_ns) {
      fail_wait(world, rank, site, static_cast<uint64_t>(value), timeout_ns);
      return false;
    }
  }
}

}  // namespace detail

// Spins (one thread) until done(*flag), then acquires at `Scope`: what the writer released before
// the store that made done() true is visible to this thread. Polling uses relaxed loads so that a
// waiting warp does not invalidate its SM's L1 on every iteration; one fence follows success.
// On timeout, records `site`, aborts the world and returns false; returns false at once when the
// world is aborted. Use thread_scope_system for flags written by other GPUs, thread_scope_device for
// local counters. `timeouts`: how many of the world's timeouts the wait may take.
template <cuda::thread_scope Scope = cuda::thread_scope_system, typename T, typename Done>
__device__ bool wait_until(const DeviceWorld& world, const CtaPlace& place, const T* flag, Done done, WaitSite site,
                           uint32_t timeouts = 1) {
  if (!detail::spin_until<Scope>(world, place.rank, flag, done, site, timeouts, global_time_ns())) return false;
  cuda::atomic_thread_fence(cuda::memory_order_acquire, Scope);
  return true;
}

namespace detail {

// The world barrier's per-CTA step, run by one thread after __syncthreads. Protocol (state layout
// in barrier_layout.hpp; `epoch` = the rank's completed barriers):
//   1. read epoch, then arrive on the rank's `arrived` counter;
//   2. the last CTA to arrive is the rank's leader for this barrier: it resets `arrived`, stores
//      epoch+1 into inbox[rank] of every rank (itself included), waits until every inbox[p] of its
//      own rank reaches epoch+1, then publishes `released` = epoch+1;
//   3. the other CTAs wait for `released` to move past epoch.
// Why it cannot deadlock: a leader announces before it waits and waits only for announcements,
// and every announcement needs only that rank's CTAs to arrive — guaranteed when all CTAs of a
// launch are co-resident (launch() launches cooperatively) and every CTA calls the barrier the
// same number of times. Ranks advance in lock step, so a peer is at most one barrier ahead (it
// cannot pass epoch+1 without our announcement); hence inbox values are compared as "≥ epoch+1"
// with wrap-around arithmetic and nothing is ever reset between barriers, launches or replays.
// Why it cannot hang: every wait is bounded. A leader gives all its peers the world's timeout in
// total; its CTAs wait twice as long, so when a peer is missing the leader's error, which names
// the missing rank, is recorded first (and its abort then ends the other waits at once). A barrier
// entered in an aborted world fails at once.
// Memory order, at system scope because data may have been stored into peers' memory over NVLink
// (device scope where every rank of the world is on this GPU: loopback, or one rank): each CTA's
// arrival is a release (after __syncthreads, cumulative over its threads'
// writes) and an acquire; the leader, which read the last arrival, issues one release fence before
// its announcements and one acq_rel fence between reading the peers' announcements and
// `released`; waiting CTAs acquire `released` (wait_until) before __syncthreads lets their threads
// go on. So every write made before the barrier by any CTA of any rank is visible after it to
// every thread of every rank.
template <cuda::thread_scope Scope>
__device__ inline bool barrier_step(const DeviceWorld& world, const CtaPlace& place) {
  using Word = cuda::atomic_ref<uint32_t, Scope>;
  const int rank = place.rank;
  uint32_t* state = barrier_state(world, rank);
  if (const uint32_t aborted = world_abort_word(world, rank); aborted != 0) {
    record_world_aborted(world, rank, aborted);
    return false;
  }
  Word arrived(state[barrier_layout::kArrived]);
  Word released(state[barrier_layout::kReleased]);

  // Must be read before arriving (the release below keeps it there): once every CTA has arrived,
  // `released` may move on at any time.
  const uint32_t epoch = released.load(cuda::memory_order_relaxed);
  const uint32_t before = arrived.fetch_add(1u, cuda::memory_order_acq_rel);
  if (before + 1 < static_cast<uint32_t>(place.count)) {
    return wait_until<Scope>(world, place, &state[barrier_layout::kReleased],
                             [epoch](uint32_t v) { return v != epoch; }, WaitSite{WaitId::barrier_release, -1},
                             2);
  }

  // Leader. The next barrier's arrivals begin only after they see `released` move, which the
  // acq_rel fence below orders after this reset.
  const uint32_t next = epoch + 1;
  arrived.store(0u, cuda::memory_order_relaxed);
  cuda::atomic_thread_fence(cuda::memory_order_release, Scope);
  for (int p = 0; p < world.world_size; ++p) {
    Word(barrier_state(world, p)[barrier_layout::kInbox + rank]).store(next, cuda::memory_order_relaxed);
  }
  // One deadline for all peers: the leader gives them the world's timeout in total.
  const uint64_t start = global_time_ns();
  for (int p = 0; p < world.world_size; ++p) {
    const auto arrived_at_next = [next](uint32_t v) { return static_cast<int32_t>(v - next) >= 0; };
    if (!spin_until<Scope>(world, rank, &state[barrier_layout::kInbox + p], arrived_at_next,
                           WaitSite{WaitId::barrier_peer, p}, 1, start)) {
      return false;
    }
  }
  cuda::atomic_thread_fence(cuda::memory_order_acq_rel, Scope);
  released.store(next, cuda::memory_order_relaxed);
  return true;
}

// Fault injection for the tests (World::stall_next_barrier): while the hook names `rank`, each of
// its CTAs reaching a barrier waits the hook's stall_ns, or until the world is aborted (so a test
// waits about one timeout, not the whole stall), then disarms the hook: the rank arrives late at
// this one barrier, whichever launch or graph replay it is in.
__device__ inline void injected_stall(const DeviceWorld& world, int rank) {
  cuda::atomic_ref<int32_t, cuda::thread_scope_device> stall_rank(world.control->stall_rank);
  if (stall_rank.load(cuda::memory_order_relaxed) != rank) return;
  const uint64_t stall_ns = cuda::atomic_ref<uint64_t, cuda::thread_scope_device>(world.control->stall_ns)
                                .load(cuda::memory_order_relaxed);
  const uint64_t start = global_time_ns();
  while (global_time_ns() - start < stall_ns && world_abort_word(world, rank) == 0) {
  }
  int32_t armed = rank;
  stall_rank.compare_exchange_strong(armed, -1, cuda::memory_order_relaxed);
}

}  // namespace detail

// Returns when every CTA of `place`'s role of every rank has arrived: writes made before it (to any
// rank's heap) are visible after it everywhere. Call from all threads of every CTA of the role, the
// same number of times in every CTA; one role per launch uses the barrier (its state counts the
// arrivals of place.count CTAs per rank). False after a timeout or in an aborted world (recorded):
// return from the kernel.
__device__ inline bool world_barrier(const DeviceWorld& world, const CtaPlace& place) {
  __syncthreads();  // this CTA's threads are done with their pre-barrier accesses
  bool ok = true;
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
    detail::injected_stall(world, place.rank);
    ok = world.world_size == world.local_ranks ? detail::barrier_step<cuda::thread_scope_device>(world, place)
                                               : detail::barrier_step<cuda::thread_scope_system>(world, place);
  }
  return __syncthreads_and(ok) != 0;  // broadcasts thread 0's result; orders the rest after it
}

}  // namespace caracal::comm
