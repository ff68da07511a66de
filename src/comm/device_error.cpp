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
    case WaitId::ready_counter:
      return "readiness counter (a CTA waiting for data other CTAs of its GPU produce in the same launch)";
    case WaitId::world_aborted:
      return "world aborted (another rank timed out first and stopped every rank's waits; that rank's own "
             "check() names the wait that expired)";
  }
  return caracal::detail::concat("unknown wait ", static_cast<uint32_t>(wait));
}

namespace {

constexpr const char* kAfterwards =
    "The pass's outputs were poisoned (NaN) and every rank of the world stops at its next barrier; this "
    "world refuses further work until World::reset() (Python: MoE.reset()) has been called on every rank. "
    "A rank that stalls on the host longer than the timeout (a checkpoint, an eval, a first-step compile) "
    "causes this: raise the timeout (World::set_wait_timeout, Python: caracal.World(..., timeout=...)).";

}  // namespace

std::string describe_device_error(const DeviceErrorRecord& record, const std::string& launch_name) {
  const auto wait = static_cast<WaitId>(record.tag);
  if (wait == WaitId::world_aborted) {
    return caracal::detail::concat("device wait ended early: rank ", record.rank, " found the world aborted by rank ",
                                   record.peer, " in launch ", record.launch, " '", launch_name,
                                   "' (rank ", record.peer, " timed out waiting; its own check() names the wait). ",
                                   kAfterwards);
  }
  const char* whom = wait == WaitId::ready_counter ? " waited on counter " : " waited for rank ";
  const std::string waited_for =
      record.peer >= 0 ? caracal::detail::concat(whom, record.peer) : std::string(" waited");
  return caracal::detail::concat("device wait timed out: ", wait_description(wait), ": rank ", record.rank, waited_for,
                                 " for ", static_cast<double>(record.timeout_ns) / 1e6, " ms (flag value ",
                                 record.seen, ") in launch ", record.launch, " '", launch_name, "'. ", kAfterwards);
}

}  // namespace caracal::comm
