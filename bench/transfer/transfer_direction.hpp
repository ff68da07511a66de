#pragma once
// One direction of a caracal_transfer_bench case on the ranks one host thread drives, the same code
// for both backends (loopback: one thread, every rank; nccl: one thread per GPU, its own rank).
// Fresh random inputs (bf16 in [-2, 2), scores in [0.05, 1)); the schedule built and its row counts
// checked against the host's; each pass run once and spot-checked (transfer_spot_checks.hpp),
// timed (median of --reps CUDA-event-bracketed runs after the warm-up) and checked again.
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "caracal/presets.hpp"
#include "caracal/routing.hpp"
#include "caracal/transfer/token_exchange.hpp"
#include "cuda_stream.hpp"
#include "transfer_bytes.hpp"
#include "transfer_spot_checks.hpp"

namespace caracal::bench {

// Forward: dispatch, combine; backward: reverse combine, reverse dispatch.
std::array<Pass, 2> passes_of(bool forward);

// Where the ranks of one exchange meet on the host. With one thread per GPU every thread must make
// the same launches in the same order (they meet in device barriers) and a check reads all ranks.
class RankGroup {
 public:
  using Check = std::function<std::string(const ExchangeRanks&)>;  // "" or the first mismatch
  virtual ~RankGroup() = default;
  // Median ms of `run` on `stream` over --reps runs after the warm-up.
  virtual double median_ms(cudaStream_t stream, const std::function<void()>& run) = 0;
  // Runs `check` over every rank once all streams are idle (the caller's is); throws CheckFailed
  // on every rank for a mismatch.
  virtual void check(const transfer::TokenExchange& ex, const Check& check) = 0;
};

// Loopback: one thread drives every rank, so nothing needs agreeing.
class OneThreadRanks final : public RankGroup {
 public:
  OneThreadRanks(int warmup, int reps) : warmup_(warmup), reps_(reps) {}
  double median_ms(cudaStream_t stream, const std::function<void()>& run) override;
  void check(const transfer::TokenExchange& ex, const Check& check) override;

 private:
  int warmup_;
  int reps_;
};

// What one thread measured, filled in as it goes (what came before a failure stays).
struct ExchangeTimes {
  double schedule_ms = 0.0;
  std::vector<double> pass_ms;  // passes_of(direction), in order
};

// The direction `ex` was made for (ExchangeOptions) on `ex`'s local ranks, as described above.
// Inputs depend on the seed and the global rank only, so both backends see the same data.
void run_exchange(transfer::TokenExchange& ex, const ModelPreset& model, const Routing& routing,
                  const std::vector<int64_t>& rows_per_rank, uint64_t seed, RankGroup& group, cudaStream_t stream,
                  ExchangeTimes& times);

}  // namespace caracal::bench
