#pragma once
// The cheap correctness checks caracal_transfer_bench runs on every case before and after timing
// it: a handful of rows or tokens per rank, read back from the device and compared bit for bit
// with what the transfer must produce from the device's own inputs (the same float operations in
// the same order as the kernels). The exhaustive checks are tests/gpu/test_transfers.cpp and
// tests/gpu/test_nccl_baseline.cpp. Each returns "" when all matches, else the first mismatch.
#include <cuda_bf16.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "caracal/comm/symmetric_ptr.hpp"
#include "caracal/routing.hpp"
#include "caracal/transfer/token_exchange.hpp"
#include "nccl_baseline_exchange.hpp"

namespace caracal::bench {

// Every rank's buffers of one exchange, as this process reaches them: in loopback one exchange
// holds all ranks; with one thread per GPU each rank has its own exchange (local rank 0 of its
// world), and the checks run on one thread while the others wait with their streams idle.
class ExchangeRanks {
 public:
  explicit ExchangeRanks(const transfer::TokenExchange& all_ranks) : exchanges_{&all_ranks} {}
  // exchanges[r] drives rank r.
  explicit ExchangeRanks(std::vector<const transfer::TokenExchange*> exchanges) : exchanges_(std::move(exchanges)) {}

  // Shape, sizes and buffer names (the same on every rank).
  const transfer::TokenExchange& exchange() const { return *exchanges_.front(); }
  int world_size() const { return exchange().world().world_size(); }

  // Elements [first, first + count) of buffer `ptr` in rank `rank`'s heap, copied to the host.
  template <typename T>
  std::vector<T> fetch(comm::SymmetricPtr<T> ptr, int rank, int64_t first, int64_t count) const {
    std::vector<T> host(static_cast<size_t>(count));
    read(rank, ptr.offset + static_cast<size_t>(first) * sizeof(T), host.data(), host.size() * sizeof(T));
    return host;
  }

 private:
  // A synchronous copy made with the rank's GPU current: an NCCL heap is mapped for its own GPU.
  void read(int rank, size_t heap_offset, void* host, size_t bytes) const;

  std::vector<const transfer::TokenExchange*> exchanges_;
};

// Every rank's schedule holds `expected[rank]` rows (its routes plus padding, from the routing).
std::string check_total_rows(const ExchangeRanks& ranks, const std::vector<int64_t>& expected);

// dispatch (x rows into expert_x) or, with `reverse_combine`, reverse combine (dy rows into
// expert_dy, g into expert_gates): sampled rows of every rank, real and padding, including that
// each real row's schedule entry names a route to that row's expert.
std::string check_pull(const ExchangeRanks& ranks, const Routing& routing, bool reverse_combine, uint64_t seed);

// combine (y = the sums of g * expert_out per (token, rank), caracal/combine_groups.hpp) or, with
// `reverse_dispatch`, reverse dispatch (dx = sum of expert_dx over the slots): sampled tokens of
// every rank, including that each slot's route_location points at a schedule row holding that
// slot. No shared expert.
std::string check_slot_sum(const ExchangeRanks& ranks, const Routing& routing, bool reverse_dispatch,
                           uint64_t seed);

// The baseline after a dispatch of the same inputs at W = 1: per-expert row counts equal
// TokenExchange's, and sampled rows equal TokenExchange's expert_x (the documented mapping).
std::string check_baseline_dispatch(const transfer::TokenExchange& ex, const NcclBaselineExchange& baseline,
                                    uint64_t seed);

// The baseline's combine of its own expert_x (an identity expert) into `y`: sampled tokens equal
// the sum of g * x over the token's routed slots (fmaf in slot order), with g from `ex`'s gates.
std::string check_baseline_combine(const transfer::TokenExchange& ex, const Routing& routing, const __nv_bfloat16* y,
                                   uint64_t seed);

}  // namespace caracal::bench
