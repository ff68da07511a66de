#pragma once
// Where one CTA of a world launch stands: which rank it serves and its place among that rank's CTAs
// of one role (DESIGN §3: communication and compute CTAs share a persistent launch). A kernel
// computes it once at entry and passes it down; the blocks below read no blockIdx.
//
// Layout of a launch (launch.cuh): local rank l owns CTAs [l * ctas_per_rank, (l + 1) *
// ctas_per_rank); a role is a contiguous range [first, first + count) of every rank's CTAs.
#include "device/comm/device_world.cuh"

namespace caracal::comm {

struct CtaPlace {
  int local_rank = 0;  // which of the process's ranks it serves (loopback: 0..W-1; NCCL: 0)
  int rank = 0;        // that rank's global index
  int index = 0;       // its index among its rank's CTAs of the role
  int count = 1;       // the role's CTAs per rank: world barriers of the role count to this
};

// This CTA's index among its rank's ctas_per_rank CTAs.
__device__ __forceinline__ int cta_of_rank(const DeviceWorld& world) {
  return static_cast<int>(blockIdx.x) % world.ctas_per_rank;
}

// The place of this CTA in the role of CTAs [first, first + count) of every rank. Only CTAs in the
// role (in_role) may use it.
__device__ __forceinline__ CtaPlace role_place(const DeviceWorld& world, int first, int count) {
  const int local = static_cast<int>(blockIdx.x) / world.ctas_per_rank;
  return CtaPlace{local, world.first_local_rank + local, cta_of_rank(world) - first, count};
}

__device__ __forceinline__ bool in_role(const DeviceWorld& world, int first, int count) {
  const int cta = cta_of_rank(world);
  return cta >= first && cta < first + count;
}

// A launch whose CTAs all do one job (the standalone kernels): one role of every CTA.
__device__ __forceinline__ CtaPlace whole_launch_place(const DeviceWorld& world) {
  return role_place(world, 0, world.ctas_per_rank);
}

}  // namespace caracal::comm
