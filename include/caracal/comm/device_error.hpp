#pragma once
// Device-side wait failures (DESIGN §3: "spin waits are bounded"). A wait that times out writes one
// DeviceErrorRecord into pinned, host-mapped memory, aborts the world (every rank's waits then end
// at once instead of timing out one after another) and its kernel returns early; the host reads
// the record at its next World::check() without synchronizing and throws caracal::Error.
// Shared by host and device code: plain data only.
#include <cstdint>
#include <string>

namespace caracal::comm {

// Which wait timed out. Engineers adding bounded waits add an entry here and its description in
// src/comm/device_error.cpp; 0 is reserved for "no error".
enum class WaitId : uint32_t {
  none = 0,
  barrier_peer = 1,     // world barrier: a rank's leader waits for a peer rank to arrive
  barrier_release = 2,  // world barrier: a CTA waits for its own rank's barrier to complete
  world_aborted = 3,    // any wait: another rank (`peer`) timed out earlier and aborted the world
  ready_counter = 4,    // a CTA waited for data other CTAs of its GPU produce (`peer`: the counter)
};

// Where a wait happens, as recorded on timeout: the wait and, if it waits on another rank, that rank.
struct WaitSite {
  WaitId wait = WaitId::none;
  int peer = -1;
};

// Lives in pinned host memory mapped into the device (one per World): a first-error channel
// (first_error.hpp) whose tag is the WaitId of the failed wait.
struct DeviceErrorRecord {
  uint32_t tag;         // WaitId; 0 = no error
  int32_t rank;         // the rank whose wait timed out
  int32_t peer;         // the rank it waited for, or -1
  uint32_t launch;      // World launch id (see World::device_view)
  uint32_t launch_name; // the launch's name as World::device_view interned it
  uint64_t seen;        // the flag's last value
  uint64_t timeout_ns;  // the timeout that expired
  uint32_t cleared;     // errors the host has taken so far (written by the host only)
  uint32_t generation;  // World::reset() count when the wait failed: records of earlier ones are stale
};

// "world barrier (leader waiting for a peer rank)" etc.; "unknown wait <n>" for unlisted ids.
std::string wait_description(WaitId wait);

// The message World::check() throws for `record`, naming the wait, the ranks and the launch.
std::string describe_device_error(const DeviceErrorRecord& record, const std::string& launch_name);

}  // namespace caracal::comm
