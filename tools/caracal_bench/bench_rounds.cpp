#include "bench_rounds.hpp"

#include <cstdio>
#include <iostream>
#include <string>
#include <utility>

#include "caracal/error.hpp"
#include "event_timer.hpp"

namespace caracal::bench_tool {

namespace {

// out = the median of get(round) over the rounds.
template <typename Get>
void set_median(const std::vector<RunResult>& rounds, double& out, Get get) {
  std::vector<double> values;
  values.reserve(rounds.size());
  for (const RunResult& r : rounds) values.push_back(get(r));
  out = bench::summarize(std::move(values)).median_ms;
}

}  // namespace

RunResult median_of_rounds(const std::vector<RunResult>& rounds) {
  CARACAL_CHECK(!rounds.empty(), "median_of_rounds: no rounds");
  RunResult m = rounds.front();
  set_median(rounds, m.forward.ms, [](const RunResult& r) { return r.forward.ms; });
  set_median(rounds, m.backward.ms, [](const RunResult& r) { return r.backward.ms; });
  set_median(rounds, m.step.ms, [](const RunResult& r) { return r.step.ms; });
  set_median(rounds, m.quantize_ms, [](const RunResult& r) { return r.quantize_ms; });
  set_median(rounds, m.step_weights_ready_ms, [](const RunResult& r) { return r.step_weights_ready_ms; });
  set_median(rounds, m.forward_bf16.ms, [](const RunResult& r) { return r.forward_bf16.ms; });
  set_median(rounds, m.backward_bf16.ms, [](const RunResult& r) { return r.backward_bf16.ms; });
  set_median(rounds, m.step_bf16.ms, [](const RunResult& r) { return r.step_bf16.ms; });
  set_median(rounds, m.forward_v1.ms, [](const RunResult& r) { return r.forward_v1.ms; });
  set_median(rounds, m.backward_v1.ms, [](const RunResult& r) { return r.backward_v1.ms; });
  set_median(rounds, m.step_v1.ms, [](const RunResult& r) { return r.step_v1.ms; });
  for (Baseline RunResult::*b : {&RunResult::cublas, &RunResult::nccl}) {
    set_median(rounds, (m.*b).forward_ms, [b](const RunResult& r) { return (r.*b).forward_ms; });
    set_median(rounds, (m.*b).backward_ms, [b](const RunResult& r) { return (r.*b).backward_ms; });
    set_median(rounds, (m.*b).exchange_ms, [b](const RunResult& r) { return (r.*b).exchange_ms; });
  }
  return m;
}

RoundRatios over_gemms_alone_by_round(const std::vector<RunResult>& rounds) {
  RoundRatios ratios;
  for (const RunResult& r : rounds) {
    // The GEMMs alone are bf16's: no measure of an FP8 layer.
    if (r.fp8 || !r.nccl.available || r.nccl.exchange_ms <= 0.0) return {};
    ratios.forward.push_back(r.forward.ms / (r.nccl.forward_ms - r.nccl.exchange_ms));
    ratios.backward.push_back(r.backward.ms / (r.nccl.backward_ms - r.nccl.exchange_ms));
  }
  return ratios;
}

void print_round_ratios(const RoundRatios& ratios) {
  if (ratios.backward.empty()) return;
  const auto list = [](const std::vector<double>& v) {
    std::string s;
    for (const double x : v) {
      char buf[16];
      std::snprintf(buf, sizeof buf, "%s%.3f", s.empty() ? "" : " ", x);
      s += buf;
    }
    return s;
  };
  std::cout << "  " << std::string(21, ' ') << "by round: forward " << list(ratios.forward) << ", backward "
            << list(ratios.backward) << "\n";
}

}  // namespace caracal::bench_tool
