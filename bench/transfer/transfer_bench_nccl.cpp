#include "transfer_bench_nccl.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "caracal/comm/cuda_check.hpp"
#include "caracal/comm/nccl_world.hpp"
#include "caracal/error.hpp"
#include "event_timer.hpp"
#include "transfer_direction.hpp"

namespace caracal::bench {
namespace {

using transfer::ExchangeOptions;
using transfer::ExchangeShape;
using transfer::TokenExchange;

constexpr double kWarmupMs = 200.0;  // time_runs's default minimum warm-up

// Thrown on every other rank's thread once one rank's thread failed, so that none waits for it.
struct PeerFailed : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// What the threads of one direction share: a reusable barrier that fails once a thread gave up,
// the figures they agree on and the exchanges a check reads. Values written before a barrier are
// read after it; each exchange of values ends with a barrier so that none is overwritten early.
class Lockstep {
 public:
  explicit Lockstep(int ranks)
      : ranks_(ranks), values_(static_cast<size_t>(ranks)), exchanges_(static_cast<size_t>(ranks)) {}

  void arrive_and_wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    if (abandoned_) throw PeerFailed("stopped: another rank failed");
    const uint64_t generation = generation_;
    if (++arrived_ == ranks_) {
      arrived_ = 0;
      ++generation_;
      changed_.notify_all();
      return;
    }
    changed_.wait(lock, [&] { return generation_ != generation || abandoned_; });
    if (generation_ == generation) throw PeerFailed("stopped: another rank failed");
  }

  // Called by a failing thread: every wait, now or later, throws PeerFailed.
  void abandon() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      abandoned_ = true;
    }
    changed_.notify_all();
  }

  // Between launches: a peer that stopped launching would leave each later launch waiting for it
  // until the device wait times out.
  // (Thrown out of time_runs, it leaves that call's events behind: the process is failing anyway.)
  void throw_if_abandoned() const {
    if (abandoned_) throw PeerFailed("stopped: another rank failed");
  }

  // The largest of every rank's `value`, the same on every rank.
  double agree_max(int rank, double value) {
    values_[static_cast<size_t>(rank)] = value;
    arrive_and_wait();
    const double most = *std::max_element(values_.begin(), values_.end());
    arrive_and_wait();
    return most;
  }

  // Rank 0's thread runs `check` over every rank's exchange while the others wait; every rank
  // gets its outcome.
  void check(int rank, const TokenExchange& ex, const RankGroup::Check& check) {
    exchanges_[static_cast<size_t>(rank)] = &ex;
    arrive_and_wait();
    if (rank == 0) {
      mismatch_.clear();
      error_.clear();
      try {
        mismatch_ = check(ExchangeRanks(exchanges_));
      } catch (const std::exception& e) {
        error_ = e.what();
      }
    }
    arrive_and_wait();
    // Rewritten only at the next check, after every rank arrived there.
    CARACAL_CHECK(error_.empty(), error_);
    require(mismatch_);
  }

 private:
  const int ranks_;
  std::mutex mutex_;
  std::condition_variable changed_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  std::atomic<bool> abandoned_{false};
  std::vector<double> values_;
  std::vector<const TokenExchange*> exchanges_;
  std::string mismatch_, error_;  // the last check's outcome
};

// One GPU's thread.
class LockstepRanks final : public RankGroup {
 public:
  LockstepRanks(Lockstep& lockstep, int rank, int warmup, int reps)
      : lockstep_(lockstep), rank_(rank), warmup_(warmup), reps_(reps) {}

  // time_runs's warm-up stops when this rank's own clock passes 200 ms, which could leave ranks
  // with different launch counts. Here the count is fixed for all: --warmup runs (at least one),
  // timed; then as many more as bring the slowest rank's estimate to 200 ms.
  double median_ms(cudaStream_t stream, const std::function<void()>& run) override {
    const auto launch = [&](int) {
      lockstep_.throw_if_abandoned();
      run();
    };
    const int first = std::max(warmup_, 1);
    const double run_ms = lockstep_.agree_max(rank_, time_runs(stream, 0, first, launch, 0.0).median_ms);
    const double left_ms = kWarmupMs - run_ms * first;
    const int more = left_ms > 0.0 ? static_cast<int>(std::ceil(left_ms / std::max(run_ms, 1e-3))) : 0;
    return time_runs(stream, more, reps_, launch, 0.0).median_ms;
  }

  void check(const TokenExchange& ex, const Check& check) override { lockstep_.check(rank_, ex, check); }

 private:
  Lockstep& lockstep_;
  int rank_;
  int warmup_;
  int reps_;
};

// The message of a stored exception.
std::string message_of(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown exception";
  }
}

// Whether a stored exception is an E.
template <typename E>
bool holds(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const E&) {
    return true;
  } catch (...) {
    return false;
  }
}

}  // namespace

std::vector<comm::NcclComm>& NcclDirections::communicators(int world_size) {
  std::vector<comm::NcclComm>& comms = comms_[world_size];
  if (comms.empty()) {
    std::vector<int> devices(static_cast<size_t>(world_size));
    for (int d = 0; d < world_size; ++d) devices[static_cast<size_t>(d)] = d;
    comms = comm::init_all(devices);
  }
  return comms;
}

void NcclDirections::run(const ModelPreset& model, const Routing& routing, bool forward, const Options& o,
                         uint64_t seed, DirectionResult& result) {
  const int W = static_cast<int>(routing.world_size);
  const ExchangeShape shape{o.tokens, model.shape.top_k, model.shape.hidden, model.shape.num_experts, kTileM};
  const std::vector<int64_t> rows_per_rank = schedule_rows_per_rank(routing, shape.num_experts, shape.tile_m);
  result.traffic = traffic_of(routing, shape, rows_per_rank, o.rows_per_route);
  const ExchangeOptions options = o.exchange_options(forward);
  const size_t heap = TokenExchange::heap_bytes(shape, W, options);
  result.heap_bytes = static_cast<double>(heap) * W;
  std::vector<comm::NcclComm>& comms = communicators(W);

  Lockstep lockstep(W);
  std::vector<ExchangeTimes> times(static_cast<size_t>(W));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(W));
  std::vector<std::thread> threads;
  for (int r = 0; r < W; ++r) {
    threads.emplace_back([&, r] {
      const size_t i = static_cast<size_t>(r);
      try {
        check_cuda(cudaSetDevice(r), "cudaSetDevice");
        Stream stream;
        comm::NcclWorld world(comms[i].get(), heap);  // collective: all threads construct together
        try {
          TokenExchange ex(world, shape, options);
          LockstepRanks group(lockstep, r, o.warmup, o.reps);
          run_exchange(ex, model, routing, rows_per_rank, seed, group, stream.get(), times[i]);
        } catch (...) {
          lockstep.abandon();  // before ~NcclWorld, which waits for every rank
          throw;
        }
      } catch (...) {
        errors[i] = std::current_exception();
        lockstep.abandon();
      }
    });
  }
  for (std::thread& thread : threads) thread.join();

  const auto passes = passes_of(forward);
  size_t timed = passes.size();
  for (const ExchangeTimes& t : times) {
    result.schedule_us = std::max(result.schedule_us, 1e3 * t.schedule_ms);
    timed = std::min(timed, t.pass_ms.size());
  }
  for (size_t p = 0; p < timed; ++p) {
    Line line;
    line.pass = name_of(passes[p]);
    line.bytes = bytes_moved(passes[p], result.traffic);
    line.remote_bytes = remote_bytes_per_rank(passes[p], result.traffic);
    for (const ExchangeTimes& t : times) line.rank_ms.push_back(t.pass_ms[p]);
    line.ms = *std::max_element(line.rank_ms.begin(), line.rank_ms.end());
    result.lines.push_back(std::move(line));
  }

  // The cause, not the ranks that stopped because of it.
  for (const bool peer_failures : {false, true}) {
    for (int r = 0; r < W; ++r) {
      const std::exception_ptr& error = errors[static_cast<size_t>(r)];
      if (!error || (!peer_failures && holds<PeerFailed>(error))) continue;
      if (holds<CheckFailed>(error)) throw CheckFailed(message_of(error));
      throw Error(caracal::detail::concat("rank ", r, ": ", message_of(error)));
    }
  }
}

}  // namespace caracal::bench
