#pragma once
// Every rank's data for the reference checks, from the host threads that drive the ranks (one for a
// loopback world, one per GPU with NCCL): each adds its ranks' weights once and their data of each
// checked step; the thread whose data completes a step gets every rank's and runs the check, so
// no thread waits for another. Thread-safe.
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "caracal/layer_config.hpp"
#include "soak_reference.hpp"

namespace caracal::soak {

class ReferenceGather {
 public:
  explicit ReferenceGather(const LayerConfig& c);

  void add_weights(int rank, RankWeights weights);
  // Every rank's data of `step` once `data` was the last of them (the step is then forgotten),
  // else nothing.
  std::optional<std::vector<RankStep>> add_step(int64_t step, int rank, RankStep data);
  // The reference of every rank's weights (built at the first call; every rank must have added its
  // weights by then). Throws caracal::Error when one has not.
  const ReferenceModel& model();

 private:
  LayerConfig c_;
  std::mutex mutex_;
  std::vector<std::optional<RankWeights>> weights_;  // [W] until the model is built
  std::unique_ptr<ReferenceModel> model_;
  std::map<int64_t, std::vector<std::optional<RankStep>>> steps_;
};

}  // namespace caracal::soak
