#pragma once
// Routing faults found on the device: an expert id outside [-1, E) in some rank's topk_idx.
// The schedule builder treats such a slot as empty (no address is ever formed from it) and records
// the first fault of a period in pinned, host-mapped memory; RoutingFaultFlag::check() raises it
// as caracal::Error without synchronizing, like World::check() does for timed-out waits.
//
// The record is a first-error channel (caracal/comm/first_error.hpp) whose tag is the RoutingFault.
#include <cstdint>

#include "caracal/comm/first_error.hpp"

namespace caracal::transfer {

enum class RoutingFault : uint32_t {
  none = 0,
  expert_out_of_range = 1,
};

struct RoutingFaultRecord {
  uint32_t tag;     // RoutingFault; written last
  int32_t seen_by;  // the rank whose schedule builder found it (every rank reads every route)
  int32_t rank;     // the home rank of the route
  int32_t token;
  int32_t slot;
  int32_t expert;  // the offending id
  int32_t num_experts;
  uint32_t cleared;  // faults the host has taken so far (written by the host only)
};

// What device code needs to report a fault.
struct RoutingFaultSink {
  RoutingFaultRecord* record = nullptr;  // device address of the pinned record
  unsigned* claim = nullptr;             // device word
};

// Owns the record. Not copyable.
class RoutingFaultFlag {
 public:
  RoutingFaultFlag();  // allocates and zeroes (synchronizes the device: setup only)
  RoutingFaultSink sink() const { return {channel_.device_record(), channel_.device_claim()}; }
  // Throws caracal::Error describing the first fault since the last check, and clears it.
  // Reads pinned memory only: a fault shows up at the first check after its kernel wrote it.
  void check();

 private:
  comm::FirstErrorChannel<RoutingFaultRecord> channel_;
};

}  // namespace caracal::transfer
