#pragma once
// Layout of the world barrier's state (device_sync.cuh), which World reserves at offset 0 of every
// rank's symmetric heap and zeroes at setup and in World::reset(). All words are uint32.
//   arrived   CTAs of this rank that arrived at the current barrier (its own 128-byte line)
//   released  barriers this rank has completed: the rank's epoch (its own 128-byte line)
//   abort     0, or 1 + the rank that timed out and aborted the world (written by that rank into
//             every rank's state; every wait polls its own; its own 128-byte line)
//   fault     the same as a float, 0.0f or 1.0f (written with `abort`, in its line): what a training
//             loop gates its optimizer step on without a host sync (World::fault_flag)
//   inbox[p]  the latest epoch rank p announced to this rank (written by p, possibly over NVLink)
// The epoch lives in device memory and is advanced only by the barrier, so the barrier carries over
// from launch to launch and across graph replays without any host reset.
#include <cstddef>

namespace caracal::comm::barrier_layout {

inline constexpr size_t kArrived = 0;    // word index
inline constexpr size_t kReleased = 32;  // word index: 128 bytes after kArrived
inline constexpr size_t kAbort = 64;     // word index
inline constexpr size_t kFault = 65;     // word index (a float)
inline constexpr size_t kInbox = 96;     // word index of inbox[0]

// Bytes reserved per rank for a world of `world_size` ranks, a multiple of 256.
constexpr size_t bytes(int world_size) {
  const size_t raw = (kInbox + static_cast<size_t>(world_size)) * sizeof(unsigned);
  return (raw + 255) / 256 * 256;
}

}  // namespace caracal::comm::barrier_layout
