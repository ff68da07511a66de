#pragma once
// Shared by the token exchange GPU tests (schedule and transfers): seeds, routings, per-rank
// uploads and downloads of symmetric buffers, poisoning, streams and bit-exact comparisons.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "caracal/comm/cuda_check.hpp"
#include "gpu_test_util.hpp"
#include "caracal/comm/symmetric_ptr.hpp"
#include "caracal/comm/world.hpp"
#include "caracal/routing.hpp"

namespace caracal::exchange_test {

using test::fresh_seed;
using test::seed_note;
using test::TracedSeed;

// The routings the tests run: random ones and the adversarial corners of the schedule.
enum class RoutingCase {
  kUniform,
  kZipf,
  kAllToOne,    // every slot of every rank to the last expert: one rank receives W*T*k rows
  kEmptyRanks,  // only rank 0's experts are used: every other rank receives nothing
  kAllEmpty,    // every slot is -1
  kDuplicates,  // a token repeats its first expert in about half of its slots
  kEmptySlots,  // uniform with 30% of the slots empty
};

// Every routing case, with its name in test names and traces.
struct NamedRoutingCase {
  RoutingCase routing;
  const char* name;
};
inline constexpr NamedRoutingCase kRoutingCases[] = {
    {RoutingCase::kUniform, "uniform"},     {RoutingCase::kZipf, "zipf"},
    {RoutingCase::kAllToOne, "all_to_one"}, {RoutingCase::kEmptyRanks, "empty_ranks"},
    {RoutingCase::kAllEmpty, "all_empty"},  {RoutingCase::kDuplicates, "duplicates"},
    {RoutingCase::kEmptySlots, "empty_slots"}};

inline const char* name_of(RoutingCase c) {
  for (const NamedRoutingCase& named : kRoutingCases) {
    if (named.routing == c) return named.name;
  }
  return "?";
}

// The loopback sweeps' grid: every world size the tests run (1, 2, 4, 8) with every routing case.
inline std::vector<std::pair<int, RoutingCase>> loopback_sweep() {
  std::vector<std::pair<int, RoutingCase>> grid;
  for (int world : {1, 2, 4, 8}) {
    for (const NamedRoutingCase& named : kRoutingCases) grid.emplace_back(world, named.routing);
  }
  return grid;
}

inline Routing make_test_routing(RoutingCase c, int64_t world, int64_t tokens, int64_t top_k, int64_t experts,
                                 uint64_t seed) {
  RoutingSpec spec;
  spec.seed = seed;
  switch (c) {
    case RoutingCase::kUniform:
      break;
    case RoutingCase::kZipf:
      spec.kind = RoutingKind::kZipf;
      spec.zipf_exponent = 1.5;
      break;
    case RoutingCase::kAllToOne:
      spec.kind = RoutingKind::kAllToOne;
      spec.target_expert = static_cast<int32_t>(experts - 1);
      break;
    case RoutingCase::kAllEmpty:
      spec.empty_slot_fraction = 1.0;
      break;
    case RoutingCase::kEmptySlots:
      spec.empty_slot_fraction = 0.3;
      break;
    case RoutingCase::kEmptyRanks:
    case RoutingCase::kDuplicates:
      break;
  }
  Routing routing = make_routing(spec, world, tokens, top_k, experts);
  const int32_t local = static_cast<int32_t>(experts / world);
  if (c == RoutingCase::kEmptyRanks) {
    for (int32_t& id : routing.topk_idx) id %= local;
  } else if (c == RoutingCase::kDuplicates) {
    std::mt19937_64 rng(seed ^ 0xd1b54a32d192ed03ull);
    for (size_t first = 0; first < routing.topk_idx.size(); first += static_cast<size_t>(top_k)) {
      for (int64_t slot = 1; slot < top_k; ++slot) {
        if (rng() & 1u) routing.topk_idx[first + static_cast<size_t>(slot)] = routing.topk_idx[first];
      }
    }
  }
  return routing;
}

// ---- Device buffers of one local rank ---------------------------------------------------------

template <typename Device, typename Host>
void upload(const comm::World& world, comm::SymmetricPtr<Device> buffer, int local_rank,
            const std::vector<Host>& values) {
  static_assert(sizeof(Device) == sizeof(Host), "host and device elements must have the same size");
  check_cuda(cudaMemcpy(world.local_pointer(buffer, local_rank), values.data(), values.size() * sizeof(Host),
                        cudaMemcpyHostToDevice),
             "cudaMemcpy(upload)");
}

template <typename Host, typename Device>
std::vector<Host> download(const comm::World& world, comm::SymmetricPtr<Device> buffer, int local_rank, int64_t count) {
  static_assert(sizeof(Device) == sizeof(Host), "host and device elements must have the same size");
  std::vector<Host> values(static_cast<size_t>(count));
  check_cuda(cudaMemcpy(values.data(), world.local_pointer(buffer, local_rank), values.size() * sizeof(Host),
                        cudaMemcpyDeviceToHost),
             "cudaMemcpy(download)");
  return values;
}

// Fills `count` elements with `byte` so that every element a kernel should write must be written.
template <typename Device>
void poison(const comm::World& world, comm::SymmetricPtr<Device> buffer, int local_rank, int64_t count,
            unsigned char byte) {
  check_cuda(cudaMemset(world.local_pointer(buffer, local_rank), byte, static_cast<size_t>(count) * sizeof(Device)),
             "cudaMemset(poison)");
}

// Waits for the uploads and poisoning above: they run on the legacy default stream, which does not
// order against the tests' non-blocking streams (and a pageable cudaMemcpy may return before its
// copy lands).
inline void settle() { check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize(settle)"); }

inline constexpr unsigned char kPoisonByte = 0xA5;  // ints: 0xA5A5A5A5, never a valid index or -1
inline constexpr unsigned char kNanByte = 0xFF;     // bf16 0xFFFF and fp32 0xFFFFFFFF: NaN

using test::Stream;

// ---- Bit-exact comparison -------------------------------------------------------------------

template <typename T>
uint64_t bits_of(const T& value) {
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  return bits;
}

// Every element equal bit for bit (so NaN poison, -0 and +0 all count); names the first few
// mismatches by index.
template <typename T>
void expect_same_bits(const std::vector<T>& got, const std::vector<T>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t mismatches = 0;
  std::ostringstream first;
  for (size_t i = 0; i < got.size(); ++i) {
    if (bits_of(got[i]) == bits_of(want[i])) continue;
    if (mismatches < 5)
      first << "\n  [" << i << "] got 0x" << std::hex << bits_of(got[i]) << ", want 0x" << bits_of(want[i]) << std::dec;
    ++mismatches;
  }
  EXPECT_EQ(mismatches, 0u) << what << ": " << mismatches << " of " << got.size() << " elements differ" << first.str();
}

}  // namespace caracal::exchange_test
