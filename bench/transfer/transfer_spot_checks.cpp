#include "transfer_spot_checks.hpp"

#include <cuda_runtime.h>
#include <vector_types.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "caracal/bf16.hpp"
#include "caracal/combine_groups.hpp"
#include "caracal/comm/cuda_check.hpp"
#include "caracal/error.hpp"
#include "float_bits.hpp"

namespace caracal::bench {
namespace {

constexpr int kSampledRows = 8;     // random rows per rank, besides segment edges of a few experts
constexpr int kSampledExperts = 3;  // random experts per rank, besides the first and the last
constexpr int kSampledTokens = 6;   // random tokens per rank, besides the first and the last

template <typename T>
std::vector<T> fetch(const T* device, int64_t count) {
  std::vector<T> host(static_cast<size_t>(count));
  check_cuda(cudaMemcpy(host.data(), device, host.size() * sizeof(T), cudaMemcpyDeviceToHost),
             "cudaMemcpy(spot check)");
  return host;
}

// Row `row` of a [rows][hidden] bf16 buffer, as bits.
std::vector<uint16_t> fetch_row(const __nv_bfloat16* base, int64_t row, int64_t hidden) {
  return fetch(reinterpret_cast<const uint16_t*>(base) + row * hidden, hidden);
}

// The same from rank `rank`'s heap.
std::vector<uint16_t> fetch_row(const ExchangeRanks& ranks, comm::SymmetricPtr<__nv_bfloat16> rows, int rank,
                                int64_t row, int64_t hidden) {
  return ranks.fetch(comm::SymmetricPtr<uint16_t>{rows.offset}, rank, row * hidden, hidden);
}

// "" if equal, else where the first difference is.
std::string compare_bits(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want) {
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i]) {
      return caracal::detail::concat("element ", i, " is 0x", std::hex, got[i], ", want 0x", want[i]);
    }
  }
  return "";
}

std::vector<uint16_t> to_bits(const std::vector<float>& values) {
  std::vector<uint16_t> bits(values.size());
  for (size_t i = 0; i < values.size(); ++i) bits[i] = bf16_bits(values[i]);
  return bits;
}

// The first and last token and a few random ones.
std::vector<int64_t> sampled_tokens(int64_t tokens, std::mt19937_64& rng) {
  std::vector<int64_t> picks{0, tokens - 1};
  for (int i = 0; i < kSampledTokens; ++i) picks.push_back(static_cast<int64_t>(rng() % static_cast<uint64_t>(tokens)));
  return picks;
}

// Experts [0, count) to look at: the first, the last and a few random ones.
std::vector<int64_t> sampled_experts(int64_t count, std::mt19937_64& rng) {
  std::vector<int64_t> picks{0, count - 1};
  for (int i = 0; i < kSampledExperts; ++i) picks.push_back(static_cast<int64_t>(rng() % static_cast<uint64_t>(count)));
  return picks;
}

bool routed(int32_t id, int64_t num_experts) { return id >= 0 && id < num_experts; }

}  // namespace

void ExchangeRanks::read(int rank, size_t heap_offset, void* host, size_t bytes) const {
  const transfer::TokenExchange& ex = *exchanges_[exchanges_.size() == 1 ? 0 : static_cast<size_t>(rank)];
  const comm::World& world = ex.world();
  const char* device = world.local_heap(rank - world.first_local_rank()) + heap_offset;
  int current = 0;
  check_cuda(cudaGetDevice(&current), "cudaGetDevice");
  if (current != world.device()) check_cuda(cudaSetDevice(world.device()), "cudaSetDevice(spot check)");
  const cudaError_t copied = cudaMemcpy(host, device, bytes, cudaMemcpyDeviceToHost);
  if (current != world.device()) check_cuda(cudaSetDevice(current), "cudaSetDevice(spot check)");
  check_cuda(copied, "cudaMemcpy(spot check)");
}

std::string check_total_rows(const ExchangeRanks& ranks, const std::vector<int64_t>& expected) {
  for (int r = 0; r < ranks.world_size(); ++r) {
    const int64_t L = ranks.exchange().sizes().local_experts;
    const int32_t got = ranks.fetch(ranks.exchange().schedule_buffers().expert_offset, r, L, 1)[0];
    if (got != expected[static_cast<size_t>(r)]) {
      return caracal::detail::concat("schedule: rank ", r, " has ", got, " rows, the host expects ",
                                     expected[static_cast<size_t>(r)]);
    }
  }
  return "";
}

std::string check_pull(const ExchangeRanks& ranks, const Routing& routing, bool reverse_combine, uint64_t seed) {
  const transfer::TokenExchange& ex = ranks.exchange();
  const transfer::ScheduleBuffers& schedule = ex.schedule_buffers();
  const int64_t D = ex.shape().hidden, k = ex.shape().top_k, L = ex.sizes().local_experts;
  const char* what = reverse_combine ? "reverse_combine" : "dispatch";
  const comm::SymmetricPtr<__nv_bfloat16> expert_rows =
      reverse_combine ? ex.backward_buffers().expert_dy : ex.forward_buffers().expert_x;
  const comm::SymmetricPtr<__nv_bfloat16> home_rows =
      reverse_combine ? ex.backward_buffers().dy : ex.forward_buffers().x;
  std::mt19937_64 rng(seed);
  for (int r = 0; r < ranks.world_size(); ++r) {
    const std::vector<int32_t> offset = ranks.fetch(schedule.expert_offset, r, 0, L + 1);
    const std::vector<int32_t> count = ranks.fetch(schedule.expert_count, r, 0, L);
    // Each sampled expert's first and last real row and first padding row, then random rows.
    std::vector<int64_t> rows;
    for (const int64_t l : sampled_experts(L, rng)) {
      const int64_t first = offset[static_cast<size_t>(l)];
      const int64_t end = first + count[static_cast<size_t>(l)];
      if (end > first) rows.insert(rows.end(), {first, end - 1});
      if (end < offset[static_cast<size_t>(l + 1)]) rows.push_back(end);
    }
    const int64_t total = offset.back();
    for (int i = 0; i < kSampledRows && total > 0; ++i)
      rows.push_back(static_cast<int64_t>(rng() % static_cast<uint64_t>(total)));

    for (const int64_t row : rows) {
      const int2 entry = ranks.fetch(schedule.rows, r, row, 1)[0];
      const int64_t l = std::upper_bound(offset.begin(), offset.end(), row) - offset.begin() - 1;
      const bool real = row < offset[static_cast<size_t>(l)] + count[static_cast<size_t>(l)];
      const std::string where =
          caracal::detail::concat(what, ": rank ", r, " row ", row, " (local expert ", l, ", ",
                                  real ? "real" : "padding", ", entry {", entry.x, ", ", entry.y, "}): ");
      const std::vector<uint16_t> got = fetch_row(ranks, expert_rows, r, row, D);
      float gate = 0.0f;
      std::vector<uint16_t> want(static_cast<size_t>(D), 0);
      if (!real) {
        if (entry.x != -1) return where + "a padding row must have src_rank -1";
      } else {
        if (entry.x < 0 || entry.x >= ranks.world_size() || entry.y < 0 || entry.y >= ex.sizes().routes) {
          return where + "entry out of range";
        }
        const int32_t id = routing.at(entry.x, entry.y / k, entry.y % k);
        if (id != r * L + l)
          return caracal::detail::concat(where, "the route goes to expert ", id, ", not ", r * L + l);
        want = fetch_row(ranks, home_rows, entry.x, entry.y / k, D);
        if (reverse_combine) gate = ranks.fetch(ex.router_buffers().gates, entry.x, entry.y, 1)[0];
      }
      if (const std::string diff = compare_bits(got, want); !diff.empty()) return where + diff;
      if (reverse_combine) {
        const float got_gate = ranks.fetch(ex.backward_buffers().expert_gates, r, row, 1)[0];
        if (float_bits(got_gate) != float_bits(gate)) {
          return caracal::detail::concat(where, "expert_gates is ", got_gate, ", want ", gate);
        }
      }
    }
  }
  return "";
}

std::string check_slot_sum(const ExchangeRanks& ranks, const Routing& routing, bool reverse_dispatch,
                           uint64_t seed) {
  const transfer::TokenExchange& ex = ranks.exchange();
  const transfer::ScheduleBuffers& schedule = ex.schedule_buffers();
  const int64_t D = ex.shape().hidden, k = ex.shape().top_k, E = ex.shape().num_experts, L = ex.sizes().local_experts;
  const char* what = reverse_dispatch ? "reverse_dispatch" : "combine";
  const comm::SymmetricPtr<__nv_bfloat16> expert_rows =
      reverse_dispatch ? ex.backward_buffers().expert_dx : ex.forward_buffers().expert_out;
  const comm::SymmetricPtr<__nv_bfloat16> out = reverse_dispatch ? ex.backward_buffers().dx : ex.forward_buffers().y;
  std::mt19937_64 rng(seed);
  for (int r = 0; r < ranks.world_size(); ++r) {
    for (const int64_t t : sampled_tokens(ex.shape().tokens, rng)) {
      const std::string where = caracal::detail::concat(what, ": rank ", r, " token ", t, ": ");
      const int64_t first_route = t * k;
      const std::vector<int2> location = ranks.fetch(schedule.route_location, r, first_route, k);
      const std::vector<float> gates = ranks.fetch(ex.router_buffers().gates, r, first_route, k);
      std::vector<float> acc(static_cast<size_t>(D), 0.0f);  // reverse dispatch's sum
      std::vector<SlotPlace> places(static_cast<size_t>(k));  // combine's groups
      std::vector<std::vector<uint16_t>> values(static_cast<size_t>(k));
      for (int64_t s = 0; s < k; ++s) {
        const int32_t id = routing.at(r, t, s);
        if (!routed(id, E)) continue;
        const int2 at = location[static_cast<size_t>(s)];
        if (at.x != id / L || at.y < 0) {
          return caracal::detail::concat(where, "slot ", s, " (expert ", id, ") located at {", at.x, ", ", at.y, "}");
        }
        const int2 entry = ranks.fetch(schedule.rows, at.x, at.y, 1)[0];
        if (entry.x != r || entry.y != first_route + s) {
          return caracal::detail::concat(where, "slot ", s, ": schedule row {", at.x, ", ", at.y, "} holds {", entry.x,
                                         ", ", entry.y, "}");
        }
        const std::vector<uint16_t> value = fetch_row(ranks, expert_rows, at.x, at.y, D);
        for (size_t d = 0; d < acc.size(); ++d) acc[d] = acc[d] + bf16_to_float(value[d]);
        places[static_cast<size_t>(s)] = {true, at.x, at.y};
        values[static_cast<size_t>(s)] = value;
      }
      std::vector<uint16_t> want;
      if (reverse_dispatch) {
        want = to_bits(acc);
      } else {
        std::vector<const uint16_t*> rows;
        for (const std::vector<uint16_t>& v : values) rows.push_back(v.empty() ? nullptr : v.data());
        want = combine_token_row(places, gates, rows, nullptr, D, /*group_rows=*/0, ex.options().rows_per_route);
      }
      if (const std::string diff = compare_bits(fetch_row(ranks, out, r, t, D), want); !diff.empty())
        return where + diff;
    }
  }
  return "";
}

std::string check_baseline_dispatch(const transfer::TokenExchange& ex, const NcclBaselineExchange& baseline,
                                    uint64_t seed) {
  const comm::World& world = ex.world();
  CARACAL_CHECK(world.world_size() == 1, "check_baseline_dispatch compares at W = 1 only");
  const int64_t D = ex.shape().hidden;
  const int64_t L = ex.sizes().local_experts;
  const std::vector<int32_t> offset = fetch(world.local_pointer(ex.schedule_buffers().expert_offset), L + 1);
  const std::vector<int32_t> count = fetch(world.local_pointer(ex.schedule_buffers().expert_count), L);
  std::vector<int64_t> first(static_cast<size_t>(L) + 1, 0);  // each expert's first row in the baseline
  for (size_t l = 0; l < static_cast<size_t>(L); ++l) {
    const int64_t n = baseline.expert_rows()[l];
    if (n != count[l])
      return caracal::detail::concat("baseline dispatch: expert ", l, " has ", n, " rows, want ", count[l]);
    first[l + 1] = first[l] + n;
  }
  std::mt19937_64 rng(seed);
  for (const int64_t l : sampled_experts(L, rng)) {
    const int64_t n = count[static_cast<size_t>(l)];
    for (const int64_t j : {int64_t{0}, n / 2, n - 1}) {
      if (j < 0 || j >= n) continue;
      const std::vector<uint16_t> got = fetch_row(baseline.expert_x(), first[static_cast<size_t>(l)] + j, D);
      const std::vector<uint16_t> want =
          fetch_row(world.local_pointer(ex.forward_buffers().expert_x), offset[static_cast<size_t>(l)] + j, D);
      if (const std::string diff = compare_bits(got, want); !diff.empty()) {
        return caracal::detail::concat("baseline dispatch: expert ", l, " row ", j, ": ", diff);
      }
    }
  }
  return "";
}

std::string check_baseline_combine(const transfer::TokenExchange& ex, const Routing& routing, const __nv_bfloat16* y,
                                   uint64_t seed) {
  const comm::World& world = ex.world();
  const int64_t D = ex.shape().hidden;
  const int64_t k = ex.shape().top_k;
  std::mt19937_64 rng(seed);
  for (const int64_t t : sampled_tokens(ex.shape().tokens, rng)) {
    const std::vector<uint16_t> x = fetch_row(world.local_pointer(ex.forward_buffers().x), t, D);
    const std::vector<float> gates = fetch(world.local_pointer(ex.router_buffers().gates) + t * k, k);
    std::vector<float> acc(static_cast<size_t>(D), 0.0f);
    for (int64_t s = 0; s < k; ++s) {
      if (!routed(routing.at(0, t, s), ex.shape().num_experts)) continue;
      for (size_t d = 0; d < acc.size(); ++d)
        acc[d] = std::fma(gates[static_cast<size_t>(s)], bf16_to_float(x[d]), acc[d]);
    }
    if (const std::string diff = compare_bits(fetch_row(y, t, D), to_bits(acc)); !diff.empty()) {
      return caracal::detail::concat("baseline combine: token ", t, ": ", diff);
    }
  }
  return "";
}

}  // namespace caracal::bench
