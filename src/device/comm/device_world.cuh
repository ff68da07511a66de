#pragma once
// The device-side view of an expert-parallel world, shared by every backend (DESIGN §4). Kernels
// are written for one rank: CTA blockIdx.x serves local rank blockIdx.x / ctas_per_rank (a 1-D
// grid, as launch() makes it); a kernel computes its CTA's place once (cta_place.cuh) and passes it
// to the blocks it calls. Cross-rank ordering comes only from world_barrier (device_sync.cuh,
// DESIGN §3). Waits are bounded: a wait that times out records an error (first error wins), aborts
// the world (every rank's waits end at once) and the kernel returns; the host raises it as
// caracal::Error at its next World::check().
#include <cstdint>

#include "caracal/comm/device_error.hpp"
#include "caracal/comm/symmetric_ptr.hpp"
#include "device/comm/world_control.hpp"

namespace caracal::comm {

// Made by World::device_view for exactly one launch and passed by value as the kernel's first
// parameter. What may change after a launch was captured into a CUDA graph (the wait timeout, the
// reset generation, the fault-injection hook) is not in it but in `control`, read at run time.
struct DeviceWorld {
  int world_size = 1;
  int first_local_rank = 0;  // global rank of this process's first rank (loopback: 0)
  int local_ranks = 1;       // ranks driven by this process (loopback: W, NCCL: 1)
  int ctas_per_rank = 1;
  // Every rank owns one symmetric heap of the same size; a buffer lives at the same offset in every
  // rank's heap (a SymmetricPtr), resolved for any rank by at(). heap[r] is rank r's heap as this
  // process maps it: loopback, base + r * stride (all ranks in one launch, the grid holding
  // local_ranks * ctas_per_rank CTAs); NCCL, the registered window's LSA pointer for r.
  char* const* heap = nullptr;          // [world_size] device array of heap bases
  DeviceErrorRecord* error = nullptr;   // pinned host record, read by World::check()
  unsigned* error_claim = nullptr;      // device word: the first failed wait of a period wins
  WorldControl* control = nullptr;      // the world's run-time settings (device memory)
  uint32_t launch_id = 0;               // numbers this launch in error messages
  uint32_t launch_name = 0;             // the launch's name, as World::device_view interned it

  // Buffer `p` in rank `rank`'s heap (any rank: loads and stores go over NVLink for remote ones).
  template <typename T>
  __device__ T* at(SymmetricPtr<T> p, int rank) const {
    return reinterpret_cast<T*>(__ldg(reinterpret_cast<const uintptr_t*>(heap) + rank) + p.offset);
  }

  // The bound of every wait, as set when this launch runs (read-only during launches).
  __device__ uint64_t timeout_ns() const { return __ldg(&control->timeout_ns); }
  // World::reset()'s count when this launch runs.
  __device__ uint32_t generation() const { return __ldg(&control->generation); }
};

}  // namespace caracal::comm
