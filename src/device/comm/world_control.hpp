#pragma once
// The world's settings that launches read from device memory instead of taking them by value in
// their DeviceWorld: a CUDA graph freezes its kernels' parameters at capture, so whatever reset(),
// set_wait_timeout() or the fault-injection hook change must be read at run time for a replay of an
// earlier-captured graph to follow them. One per World, in device memory of the world's device;
// World writes it in stream order (world.cu), device_sync.cuh reads it. Plain data, host and device.
#include <cstdint>

namespace caracal::comm {

struct WorldControl {
  uint64_t timeout_ns = 0;  // bound of every wait (World::set_wait_timeout); barriers' CTAs wait twice it
  uint32_t generation = 0;  // World::reset() count, stamped on the error records of the launches after it
  int32_t stall_rank = -1;  // fault injection (World::stall_next_barrier): -1, or the rank whose CTAs
  uint64_t stall_ns = 0;    //   arrive stall_ns late at its next world barrier, which then disarms it
};

}  // namespace caracal::comm
