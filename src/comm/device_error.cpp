#include "caracal/comm/device_error.hpp"

#include "caracal/error.hpp"

namespace caracal::comm {

std::string wait_description(WaitId wait) {
  switch (wait) {
    case WaitId::none: return "no wait";
    case WaitId::barrier_peer: return "world barrier (the rank's leader waiting for a peer rank to arrive)";
    case WaitId::barrier_release:
      return "world barrier (a CTA waiting for the rest of its own rank: one of its CTAs did not arrive, or "
             "its leader timed out)";
  }
  return caracal::detail::concat("unknown wait ", static_cast<uint32_t>(wait));
}

std::string describe_device_error(const DeviceErrorRecord& record, const std::string& launch_name) {
  const std::string waited_for =
      record.peer >= 0 ? caracal::detail::concat(" waited for rank ", record.peer) : std::string(" waited");
  return caracal::detail::concat("device wait timed out: ", wait_description(static_cast<WaitId>(record.wait)),
                        ": rank ", record.rank, waited_for, " for ", static_cast<double>(record.timeout_ns) / 1e6,
                         " ms (flag value ", record.seen, ") in launch ", record.launch, " '", launch_name,
                        "'. The kernel returned early: its outputs and the barrier state are invalid; "
                        "call World::reset_barrier() on every rank before the next launch.");
}

}  // namespace caracal::comm
