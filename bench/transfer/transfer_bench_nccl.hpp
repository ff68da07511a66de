#pragma once
// caracal_transfer_bench --backend nccl: each direction of a case on W GPUs over NVLink, rank r on
// GPU r, one host thread per GPU, each with its own NcclWorld (made concurrently: construction is
// collective), TokenExchange and stream, running transfer_direction.hpp's per-rank code in lock-step.
// A figure is the slowest rank's median; bandwidth counts only NVLink bytes (transfer_bytes.hpp).
#include <cstdint>
#include <map>
#include <vector>

#include "caracal/comm/nccl_bootstrap.hpp"
#include "caracal/presets.hpp"
#include "caracal/routing.hpp"
#include "transfer_case.hpp"

namespace caracal::bench {

class NcclDirections {
 public:
  // One direction of a case on routing.world_size GPUs: fills `result` with what every rank
  // measured, then throws the first rank's failure (CheckFailed for a wrong value).
  void run(const ModelPreset& model, const Routing& routing, bool forward, const Options& o, uint64_t seed,
           DirectionResult& result);

 private:
  std::vector<comm::NcclComm>& communicators(int world_size);

  std::map<int, std::vector<comm::NcclComm>> comms_;  // per W, on GPUs 0 .. W-1, made on first use
};

}  // namespace caracal::bench
