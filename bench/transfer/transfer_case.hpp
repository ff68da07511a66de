#pragma once
// What the parts of caracal_transfer_bench share: its options, the figures of one direction of a
// case, and how a spot check's mismatch travels (CheckFailed: exit status 2, not 1).
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "caracal/transfer/token_exchange.hpp"
#include "transfer_bytes.hpp"

namespace caracal::bench {

constexpr int64_t kTileM = 128;  // expert segments padded to the grouped GEMM's M tile

struct Options {
  std::string backend = "loopback";  // "loopback": W virtual ranks on one GPU; "nccl": one GPU per rank
  std::vector<std::string> models{"deepseek-v3", "kimi-k2"};
  std::vector<std::string> routings{"uniform", "zipf:1.2"};
  std::vector<int> worlds{8, 1};
  int64_t tokens = 4096;
  int warmup = 5;
  int reps = 30;
  uint64_t seed = 0;
  bool fixed_seed = false;  // --seed given
  bool no_baseline = false;
  int exchange_sms = 0;              // ExchangeOptions::max_sms (0: the default)
  bool rows_per_route = false;       // ExchangeOptions::rows_per_route
  std::string json_path;

  transfer::ExchangeOptions exchange_options(bool forward) const {
    transfer::ExchangeOptions options{forward, !forward, false};
    options.max_sms = exchange_sms;
    options.rows_per_route = rows_per_route;
    return options;
  }

  bool nccl() const { return backend == "nccl"; }
};

// A spot check found a wrong value.
struct CheckFailed : std::runtime_error {
  using std::runtime_error::runtime_error;
};

inline void require(const std::string& mismatch) {
  if (!mismatch.empty()) throw CheckFailed(mismatch);
}

// One line of the table.
struct Line {
  std::string pass;
  double ms = 0.0;                 // nccl: the slowest rank's median
  double bytes = 0.0;              // bytes moved by TokenExchange's pass (baseline lines too: the same rows)
  double copy_ms = 0.0;            // loopback: a D2D copy moving `bytes`
  double token_exchange_ms = 0.0;  // baseline lines: TokenExchange's pass on the same data
  std::vector<double> rank_ms;       // nccl: [W] each rank's median
  std::vector<double> remote_bytes;  // nccl: [W] NVLink bytes into each GPU (transfer_bytes.hpp)
};

// One direction of one (model, routing, W) case.
struct DirectionResult {
  std::string model, routing, direction;
  int world = 0;
  RowTraffic traffic;
  double heap_bytes = 0.0;  // all ranks' symmetric heaps
  double schedule_us = 0.0;  // nccl: the slowest rank's median
  std::vector<Line> lines;
  std::string error;  // set when the direction did not complete
  bool check_failed = false;
};

}  // namespace caracal::bench
