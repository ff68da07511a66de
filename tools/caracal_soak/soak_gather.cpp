#include "soak_gather.hpp"

#include <utility>

#include "caracal/error.hpp"

namespace caracal::soak {

ReferenceGather::ReferenceGather(const LayerConfig& c) : c_(c), weights_(static_cast<size_t>(c.ep_size)) {}

void ReferenceGather::add_weights(int rank, RankWeights weights) {
  const std::lock_guard<std::mutex> lock(mutex_);
  weights_.at(static_cast<size_t>(rank)) = std::move(weights);
}

std::optional<std::vector<RankStep>> ReferenceGather::add_step(int64_t step, int rank, RankStep data) {
  const std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::optional<RankStep>>& ranks = steps_[step];
  ranks.resize(static_cast<size_t>(c_.ep_size));
  ranks.at(static_cast<size_t>(rank)) = std::move(data);
  for (const std::optional<RankStep>& r : ranks) {
    if (!r) return std::nullopt;
  }
  std::vector<RankStep> all;
  for (std::optional<RankStep>& r : ranks) all.push_back(std::move(*r));
  steps_.erase(step);
  return all;
}

const ReferenceModel& ReferenceGather::model() {
  const std::lock_guard<std::mutex> lock(mutex_);
  if (!model_) {
    std::vector<RankWeights> all;
    for (size_t r = 0; r < weights_.size(); ++r) {
      CARACAL_CHECK(weights_[r].has_value(), "caracal-soak: rank ", r, " has not added its weights for the reference");
      all.push_back(std::move(*weights_[r]));
    }
    weights_.clear();
    model_ = std::make_unique<ReferenceModel>(c_, all);
  }
  return *model_;
}

}  // namespace caracal::soak
