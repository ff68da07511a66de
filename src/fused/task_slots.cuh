#pragma once
// Where a fused kernel's producer hands each tile's task to its consumers: a slot per stage of its
// GEMMs' ring (their policy's stages) for each CTA of a rank (TaskSlot, BackwardTaskSlot), in
// global memory after the rank's readiness counters.
#include "device/comm/device_world.cuh"

namespace caracal::fused {

// This CTA's index among its rank's, from a fresh read of %ctaid.x (volatile: not hoisted).
__device__ inline int cta_in_rank(const comm::DeviceWorld& world) {
  uint32_t cta;
  asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(cta));
  return static_cast<int>(cta) % world.ctas_per_rank;
}

// The local rank this CTA serves, from a fresh read of %ctaid.x (volatile: not hoisted).
__device__ inline int local_rank_of_cta(const comm::DeviceWorld& world) {
  uint32_t cta;
  asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(cta));
  return static_cast<int>(cta) / world.ctas_per_rank;
}

// This CTA's first task slot among its rank's (place.index * Stages) in a ring of Stages, from a
// fresh read of %ctaid.x (volatile: not hoisted): producer and consumers find it again on every
// task, as a register held across their loops spills.
template <int Stages>
__device__ int first_task_slot(const comm::DeviceWorld& world) {
  return cta_in_rank(world) * Stages;
}

}  // namespace caracal::fused
