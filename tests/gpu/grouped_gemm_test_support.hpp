#pragma once
// Helpers shared by the grouped-GEMM tests (forward and backward): device buffers, random bf16
// data, expert row layouts, routed counts from the schedule host twin, argument-error checks.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <iostream>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "caracal/bf16.hpp"
#include "caracal/error.hpp"
#include "caracal/gemm/grouped_gemm.hpp"
#include "caracal/routing.hpp"
#include "caracal/schedule.hpp"
#include "output_checks.hpp"

namespace caracal::test::gemm {

inline constexpr uint16_t kPoison = 0xFFFF;  // a bf16 NaN (and, twice, an fp32 NaN)

inline uint64_t fresh_seed() {
  std::random_device rd;
  return (uint64_t(rd()) << 32) | uint64_t(rd());
}

// Owns one device allocation.
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
  void allocate(size_t count) {
    count_ = count;
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&ptr_), std::max<size_t>(count, 1) * sizeof(T)),
              cudaSuccess);
  }
  void upload(const std::vector<T>& host) {
    allocate(host.size());
    ASSERT_EQ(cudaMemcpy(ptr_, host.data(), bytes(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  void download(std::vector<T>& host) const {
    host.resize(count_);
    ASSERT_EQ(cudaMemcpy(host.data(), ptr_, bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
  }
  void poison() { ASSERT_EQ(cudaMemset(ptr_, 0xFF, bytes()), cudaSuccess); }
  T* get() const { return ptr_; }
  size_t bytes() const { return count_ * sizeof(T); }

 private:
  T* ptr_ = nullptr;
  size_t count_ = 0;
};

inline __nv_bfloat16* as_bf16(uint16_t* p) { return reinterpret_cast<__nv_bfloat16*>(p); }

// One problem shape: D, I and the real rows of each local expert.
struct Case {
  std::string name;
  int hidden = 0;
  int intermediate = 0;
  std::vector<int> counts;
};

inline void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

// Expert segments padded to 128 rows, plus one spare block at the end that no expert owns.
struct RowLayout {
  std::vector<int32_t> offset;  // [L + 1]
  int capacity = 0;
};

inline RowLayout layout_rows(const std::vector<int>& counts) {
  constexpr int kTile = caracal::gemm::kGroupedGemmTileM;
  RowLayout l;
  l.offset.push_back(0);
  for (int c : counts) l.offset.push_back(l.offset.back() + (c + kTile - 1) / kTile * kTile);
  l.capacity = l.offset.back() + kTile;
  return l;
}

// Uniform values in [-scale, scale], as bf16 bits.
inline std::vector<uint16_t> random_bf16(size_t n, double scale, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> dist(-scale, scale);
  std::vector<uint16_t> v(n);
  for (auto& b : v) b = caracal::bf16_bits(float(dist(rng)));
  return v;
}

// The case of the ...CatchDeliberateErrors tests: expert 7 holds 300 of 814 rows.
inline const Case kChecksCase{"checks", 256, 128, {0, 1, 127, 128, 129, 64, 65, 300}};

// `rows` rows of `cols` bf16 values from `first_row`, each multiplied by `factor` (a deliberate error).
inline std::vector<uint16_t> scaled_rows(std::vector<uint16_t> v, size_t first_row, size_t rows, size_t cols,
                                         float factor) {
  for (size_t i = first_row * cols; i < (first_row + rows) * cols; ++i) {
    v[i] = caracal::bf16_bits(factor * caracal::bf16_to_float(v[i]));
  }
  return v;
}

inline std::vector<double> widen(const std::vector<uint16_t>& bits) {
  return caracal::from_bf16_bits(bits);
}

template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// Bounds of the grouped-GEMM outputs: relative Frobenius error over the output (`frobenius`) and
// of the worst expert's rows (`row`), about 3x the largest error measured on an H200 (2026-12-01,
// three runs of every case of both suites; docs/PERF.md). Measured (whole / worst expert): gate,
// up 1.5e-4 / 1.9e-4, hidden 2.8e-4 / 3.6e-4, y 4.2e-4 / 5.0e-4, d_gate, d_up 1.6e-4 / 2.1e-4,
// dx 3.3e-4 / 3.6e-4, scaled_activation exactly 0.
inline constexpr caracal::test::ErrorBound kGateUpBound{5e-4, 7e-4};         // F1
inline constexpr caracal::test::ErrorBound kHiddenBound{9e-4, 1.2e-3};       // F2
inline constexpr caracal::test::ErrorBound kDownBound{1.3e-3, 1.6e-3};       // F3
inline constexpr caracal::test::ErrorBound kDgradBound{5e-4, 7e-4};          // B2: d_gate, d_up
inline constexpr caracal::test::ErrorBound kScaledHiddenBound{1e-5, 1e-5};   // bf16(g * hidden)
inline constexpr caracal::test::ErrorBound kDxBound{1e-3, 1.2e-3};           // B3

// One bf16 output over the real rows (counts[e] rows from offset[e]) against `ref` ([rows][cols],
// indexed like the row buffers), expert by expert; `value(row, col)` reads the kernel's output
// bits. What is out of `bound` (empty: nothing), NaN (unwritten) elements included.
inline std::vector<std::string> close_failures(const char* what, const RowLayout& rows, const std::vector<int>& counts,
                                               size_t cols, const std::vector<double>& ref,
                                               const std::function<uint16_t(size_t, size_t)>& value,
                                               const caracal::test::ErrorBound& bound, bool report = true) {
  caracal::test::OutputError e(what);
  for (size_t x = 0; x < counts.size(); ++x) {
    const size_t begin = size_t(rows.offset[x]);
    for (size_t row = begin; row < begin + size_t(counts[x]); ++row) {
      for (size_t col = 0; col < cols; ++col) {
        e.add(double(caracal::bf16_to_float(value(row, col))), ref[row * cols + col]);
      }
    }
    e.end_row();  // one expert's block
  }
  return e.failures(bound, report);
}

inline void expect_close(const char* what, const RowLayout& rows, const std::vector<int>& counts, size_t cols,
                         const std::vector<double>& ref, const std::function<uint16_t(size_t, size_t)>& value,
                         const caracal::test::ErrorBound& bound) {
  for (const std::string& f : close_failures(what, rows, counts, cols, ref, value, bound)) ADD_FAILURE() << f;
}

// Padding rows inside expert segments hold zeros (+-0); rows past the last segment keep the
// poison.
inline void expect_padding(const char* what, const RowLayout& rows, const std::vector<int>& counts,
                           size_t cols, const std::vector<uint16_t>& out) {
  size_t nonzero = 0, touched = 0;
  for (size_t e = 0; e < counts.size(); ++e) {
    for (size_t row = size_t(rows.offset[e]) + size_t(counts[e]); row < size_t(rows.offset[e + 1]);
         ++row) {
      for (size_t col = 0; col < cols; ++col) nonzero += (out[row * cols + col] & 0x7FFF) != 0;
    }
  }
  for (size_t row = size_t(rows.offset.back()); row < size_t(rows.capacity); ++row) {
    for (size_t col = 0; col < cols; ++col) touched += out[row * cols + col] != kPoison;
  }
  EXPECT_EQ(nonzero, 0u) << what << ": padding rows must hold zeros";
  EXPECT_EQ(touched, 0u) << what << ": rows past expert_offset[L] must be left untouched";
}

// Per-expert counts of one receiving rank under a generated routing (host schedule twin).
inline std::vector<int> routed_counts(caracal::RoutingKind kind, int64_t world, int64_t tokens,
                                      int64_t top_k, int64_t experts, int64_t rank, uint64_t seed) {
  caracal::RoutingSpec spec;
  spec.kind = kind;
  spec.seed = seed;
  const caracal::Routing routing = caracal::make_routing(spec, world, tokens, top_k, experts);
  const caracal::RankSchedule s = caracal::build_rank_schedule(
      routing, experts, caracal::gemm::kGroupedGemmTileM, rank);
  return std::vector<int>(s.expert_count.begin(), s.expert_count.end());
}

// Fake device pointers: validation must reject the arguments before touching them.
template <typename T = __nv_bfloat16>
T* fake_ptr(uintptr_t offset_bytes = 0) {
  return reinterpret_cast<T*>(uintptr_t(1) << 20 | offset_bytes);
}

// `call` throws caracal::Error whose message holds every one of `parts`.
inline void expect_error(const std::function<void()>& call,
                         std::initializer_list<const char*> parts) {
  try {
    call();
    ADD_FAILURE() << "no caracal::Error thrown";
  } catch (const caracal::Error& e) {
    const std::string msg = e.what();
    for (const char* part : parts) EXPECT_NE(msg.find(part), std::string::npos) << msg;
  }
}

}  // namespace caracal::test::gemm
