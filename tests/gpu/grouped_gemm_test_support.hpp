#pragma once
// Helpers shared by the grouped-GEMM tests (forward and backward): the cases and their row
// layouts, random bf16 data, one case's inputs on the device and a tile queue, the references'
// SwiGLU, the kernels' argument structs, the reference suites' fixture, output checks and
// argument-error checks.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "caracal/bf16.hpp"
#include "caracal/gemm/grouped_gemm.hpp"
#include "caracal/routing.hpp"
#include "caracal/schedule.hpp"
#include "error_checks.hpp"
#include "gpu_test_util.hpp"
#include "output_checks.hpp"

namespace caracal::test::gemm {

using caracal::ScheduleView;
using caracal::test::DeviceBuffer;
using caracal::test::expect_error;
using caracal::test::fresh_seed;
using caracal::test::TracedSeed;

inline constexpr uint16_t kPoison = 0xFFFF;  // a bf16 NaN (and, twice, an fp32 NaN)

inline __nv_bfloat16* as_bf16(uint16_t* p) { return reinterpret_cast<__nv_bfloat16*>(p); }

// Elements of a poisoned bf16 output that something wrote.
inline size_t touched(const std::vector<uint16_t>& out) {
  return size_t(std::count_if(out.begin(), out.end(), [](uint16_t b) { return b != kPoison; }));
}

// ---- Cases --------------------------------------------------------------------------------------

// One problem shape: D, I and the real rows of each local expert.
struct Case {
  std::string name;
  int hidden = 0;
  int intermediate = 0;
  std::vector<int> counts;
};

inline void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

// gtest's name of a case's instance: the case's own.
inline std::string case_name(const ::testing::TestParamInfo<Case>& info) { return info.param.name; }

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

// 0, 1, tile-1, tile, tile+1 rows; 64/65 rows put a whole or partial 64-row half in padding.
// Expert 7 holds 300 of the 814 rows.
inline const std::vector<int> kEdgeCounts{0, 1, 127, 128, 129, 64, 65, 300};

// The case of the ...CatchDeliberateErrors tests.
inline const Case kChecksCase{"checks", 256, 128, kEdgeCounts};

// Experts of every size class, for the bitwise-determinism tests.
inline const Case kDeterminismCase{"determinism", 512, 256, {300, 0, 1, 129, 64, 250, 65, 128}};

// All experts empty.
inline const Case kEmptyCase{"empty", 256, 128, {0, 0, 0, 0}};

// `cases` followed by the routed cases both reference suites run: an odd token count routed
// uniformly over 16 experts, 2 ranks, seen from rank 1 (L = 8); Zipf-skewed routing, one rank,
// 8 experts.
inline std::vector<Case> with_routed_cases(std::vector<Case> cases) {
  cases.push_back({"routed_odd_tokens", 512, 256,
                   routed_counts(caracal::RoutingKind::kUniform, 2, 333, 4, 16, 1, 11)});
  cases.push_back(
      {"zipf_skewed", 384, 192, routed_counts(caracal::RoutingKind::kZipf, 1, 257, 6, 8, 0, 12)});
  return cases;
}

// ---- Rows and data ------------------------------------------------------------------------------

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

// How test inputs are drawn: uniform (x in [-1, 1], a weight of a GEMM over K in
// [-sqrt(3/K), sqrt(3/K)]) or normal (x standard normal, weights of standard deviation sqrt(1/K));
// either way a weight's variance is 1/K.
enum class Draw { kUniform, kNormal };

// Uniform values in [-scale, scale], as bf16 bits.
inline std::vector<uint16_t> random_bf16(size_t n, double scale, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> dist(-scale, scale);
  std::vector<uint16_t> v(n);
  for (auto& b : v) b = caracal::bf16_bits(float(dist(rng)));
  return v;
}

// Normal values of mean 0 and standard deviation `stddev`, as bf16 bits.
inline std::vector<uint16_t> normal_bf16(size_t n, double stddev, std::mt19937_64& rng) {
  std::normal_distribution<double> dist(0.0, stddev);
  std::vector<uint16_t> v(n);
  for (auto& b : v) b = caracal::bf16_bits(float(dist(rng)));
  return v;
}

// [capacity][cols]: `draw`'s values (uniform in [-1, 1] or standard normal) on each expert's real
// rows, zeros on padding and spare rows (as the transfers leave them).
inline std::vector<uint16_t> random_rows(const std::vector<int>& counts, const RowLayout& rows, size_t cols,
                                         std::mt19937_64& rng, Draw draw = Draw::kUniform) {
  std::vector<uint16_t> v(size_t(rows.capacity) * cols, 0);
  for (size_t e = 0; e < counts.size(); ++e) {
    const size_t n = size_t(counts[e]) * cols;
    const auto real = draw == Draw::kUniform ? random_bf16(n, 1.0, rng) : normal_bf16(n, 1.0, rng);
    std::copy(real.begin(), real.end(), v.begin() + ptrdiff_t(size_t(rows.offset[e]) * cols));
  }
  return v;
}

// n weights of a GEMM over k, drawn as `draw` says.
inline std::vector<uint16_t> random_weights(size_t n, size_t k, std::mt19937_64& rng, Draw draw) {
  if (draw == Draw::kUniform) return random_bf16(n, std::sqrt(3.0 / double(k)), rng);
  return normal_bf16(n, std::sqrt(1.0 / double(k)), rng);
}

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

// ---- One case's inputs on the device ------------------------------------------------------------

// What the forward and the backward both start from: x over the real rows, the experts' weights
// (gate and up apart for the references, interleaved on the device), the rows and their layout.
struct ExpertInputs {
  const TracedSeed seed;  // of every input: each failure reported while the inputs live names it
  Case c;
  RowLayout rows;
  int num_experts = 0;
  std::vector<uint16_t> x;             // [capacity][D]; padding and spare rows zero
  std::vector<uint16_t> w_gate, w_up;  // [L][I][D]
  std::vector<uint16_t> w_down;        // [L][D][I]
  DeviceBuffer<uint16_t> d_x, d_w_gate_up, d_w_down;
  DeviceBuffer<int32_t> d_offset, d_count;

  // The rows as the kernels take them; without the optional counts they cannot skip padding halves.
  ScheduleView schedule(bool pass_counts) const {
    return {d_offset.get(), pass_counts ? d_count.get() : nullptr, num_experts, rows.capacity};
  }
};

// Draws x and the weights of case `c` from `rng` (scaled so that gate/up and y are O(1)) and
// uploads them with the row layout.
inline void make_inputs(ExpertInputs& in, const Case& c, std::mt19937_64& rng, Draw draw = Draw::kUniform) {
  in.c = c;
  in.rows = layout_rows(c.counts);
  in.num_experts = int(c.counts.size());
  const size_t D = size_t(c.hidden), I = size_t(c.intermediate), L = size_t(in.num_experts);
  in.x = random_rows(c.counts, in.rows, D, rng, draw);
  in.w_gate = random_weights(L * I * D, D, rng, draw);
  in.w_up = random_weights(L * I * D, D, rng, draw);
  in.w_down = random_weights(L * D * I, I, rng, draw);
  std::vector<uint16_t> w_gate_up(L * 2 * I * D);
  caracal::gemm::interleave_gate_up_weights_host(
      in.w_gate.data(), in.w_up.data(), w_gate_up.data(), int64_t(L), int64_t(I), int64_t(D));
  ASSERT_NO_FATAL_FAILURE(in.d_x.upload(in.x));
  ASSERT_NO_FATAL_FAILURE(in.d_w_gate_up.upload(w_gate_up));
  ASSERT_NO_FATAL_FAILURE(in.d_w_down.upload(in.w_down));
  ASSERT_NO_FATAL_FAILURE(in.d_offset.upload(in.rows.offset));
  ASSERT_NO_FATAL_FAILURE(in.d_count.upload(std::vector<int32_t>(c.counts.begin(), c.counts.end())));
}

// The experts' W_gate_up as Hugging Face's [gate; up] halves (GateUpLayout::kHalves): W_gate then
// W_up for every expert, [L][2I][D].
inline std::vector<uint16_t> gate_up_halves(const ExpertInputs& in) {
  const size_t L = size_t(in.num_experts), ID = size_t(in.c.intermediate) * size_t(in.c.hidden);
  std::vector<uint16_t> w(2 * L * ID);
  for (size_t e = 0; e < L; ++e) {
    std::copy_n(in.w_gate.begin() + std::ptrdiff_t(e * ID), ID, w.begin() + std::ptrdiff_t(2 * e * ID));
    std::copy_n(in.w_up.begin() + std::ptrdiff_t(e * ID), ID, w.begin() + std::ptrdiff_t((2 * e + 1) * ID));
  }
  return w;
}

// [L][2I][cols] with its rows in the interleaved order (caracal::gemm::gate_up_row) put in [gate; up]
// halves order.
template <typename T>
std::vector<T> interleaved_to_halves(const std::vector<T>& v, size_t experts, size_t intermediate, size_t cols) {
  std::vector<T> out(v.size());
  for (size_t e = 0; e < experts; ++e) {
    for (size_t j = 0; j < intermediate; ++j) {
      for (const bool up : {false, true}) {
        const size_t from = (e * 2 * intermediate + size_t(caracal::gemm::gate_up_row(int64_t(j), up))) * cols;
        const size_t to = (e * 2 * intermediate + (up ? intermediate : 0) + j) * cols;
        std::copy_n(v.begin() + std::ptrdiff_t(from), cols, out.begin() + std::ptrdiff_t(to));
      }
    }
  }
  return out;
}

// A tile queue of kTileQueueWords words in `queue`, poisoned: the launcher zeroes the counter and the
// kernels write the slots before they read them.
inline void allocate_tile_queue(DeviceBuffer<uint32_t>& queue) {
  ASSERT_NO_FATAL_FAILURE(queue.allocate(size_t(caracal::gemm::kTileQueueWords)));
  ASSERT_NO_FATAL_FAILURE(queue.poison());
}

// ---- The references' SwiGLU ---------------------------------------------------------------------

inline double silu(double g) { return g / (1.0 + std::exp(-g)); }

// d silu(g) / dg.
inline double silu_grad(double g) {
  const double s = 1.0 / (1.0 + std::exp(-g));
  return s * (1.0 + g * (1.0 - s));
}

// ---- The kernels' arguments ---------------------------------------------------------------------

// A kernel's argument struct with the fields every one of them starts with: rows, D, I and the
// persistent CTAs (0: one per SM).
template <typename Args>
Args kernel_args(const ScheduleView& rows, int hidden, int intermediate, int num_ctas = 0) {
  Args a;
  a.rows = rows;
  a.hidden = hidden;
  a.intermediate = intermediate;
  a.num_ctas = num_ctas;
  return a;
}

// Up/gate + SwiGLU over the inputs' x into `activation`, and into `gate_up` unless it is null.
inline caracal::gemm::UpGateSwigluArgs up_gate_args(const ExpertInputs& in, const ScheduleView& rows,
                                                    uint16_t* activation, uint16_t* gate_up, int num_ctas = 0) {
  auto a = kernel_args<caracal::gemm::UpGateSwigluArgs>(rows, in.c.hidden, in.c.intermediate, num_ctas);
  a.x = as_bf16(in.d_x.get());
  a.w_gate_up = as_bf16(in.d_w_gate_up.get());
  a.activation_out = as_bf16(activation);
  a.gate_up_out = gate_up != nullptr ? as_bf16(gate_up) : nullptr;
  return a;
}

// Fake device pointers: validation must reject the arguments before touching them.
template <typename T = __nv_bfloat16>
T* fake_ptr(uintptr_t offset_bytes = 0) {
  return reinterpret_cast<T*>(uintptr_t(1) << 20 | offset_bytes);
}

// Valid rows for the argument checks: 4 experts, 1024 rows, fake offsets, no counts.
inline ScheduleView fake_rows() { return {fake_ptr<const int32_t>(), nullptr, 4, 1024}; }

// For expect_error: with(change) is a call of `launch` on `valid` changed by `change`.
template <typename Args>
auto calls_with(Args valid, void (*launch)(const Args&, cudaStream_t)) {
  return [valid, launch](const std::function<void(Args&)>& change) -> std::function<void()> {
    Args a = valid;
    change(a);
    return [a, launch] { launch(a, nullptr); };
  };
}

// A tile queue caps the grid at 256 CTAs: `with` (calls_with's) a queue and `num_ctas` CTAs past the
// cap throws, naming `launcher`, the cap and the count.
template <typename With>
void expect_tile_queue_cap(const With& with, const char* launcher, int num_ctas) {
  const std::string got = "got " + std::to_string(num_ctas);
  expect_error(with([num_ctas](auto& a) {
                 a.tile_queue = fake_ptr<uint32_t>();
                 a.num_ctas = num_ctas;
               }),
               {launcher, "num_ctas must be at most 256 with a tile_queue", got.c_str()});
}

// ---- Output checks ------------------------------------------------------------------------------

// Bounds of the grouped-GEMM outputs: relative Frobenius error over the output (`frobenius`) and of
// the worst expert's rows (`row`), about 3x the largest error measured on an H200 (three runs of
// every case of both suites). Measured (whole / worst
// expert): gate, up 1.5e-4 / 1.9e-4, hidden 2.8e-4 / 3.6e-4, y 4.2e-4 / 5.0e-4, d_gate, d_up
// 1.6e-4 / 2.1e-4, dx 3.3e-4 / 3.6e-4, scaled_activation exactly 0.
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

// The same for an output laid out like `ref`: [rows][cols].
inline std::vector<std::string> close_failures(const char* what, const RowLayout& rows, const std::vector<int>& counts,
                                               size_t cols, const std::vector<double>& ref,
                                               const std::vector<uint16_t>& out,
                                               const caracal::test::ErrorBound& bound, bool report = true) {
  return close_failures(
      what, rows, counts, cols, ref, [&](size_t row, size_t col) { return out[row * cols + col]; }, bound, report);
}

template <typename Output>
void expect_close(const char* what, const RowLayout& rows, const std::vector<int>& counts, size_t cols,
                  const std::vector<double>& ref, const Output& out, const caracal::test::ErrorBound& bound) {
  for (const std::string& f : close_failures(what, rows, counts, cols, ref, out, bound)) ADD_FAILURE() << f;
}

// The half (gate or up) of an interleaved [rows][2I] output (gate_up, d_gate_up) that `ref`
// ([rows][I]) holds, against it.
inline void expect_half_close(const char* what, bool is_up, const RowLayout& rows, const std::vector<int>& counts,
                              size_t intermediate, const std::vector<double>& ref,
                              const std::vector<uint16_t>& interleaved, const caracal::test::ErrorBound& bound) {
  const size_t I = intermediate;
  expect_close(
      what, rows, counts, I, ref,
      [&](size_t row, size_t j) {
        return interleaved[row * 2 * I + size_t(caracal::gemm::gate_up_row(int64_t(j), is_up))];
      },
      bound);
}

// Padding rows inside expert segments hold zeros (+-0); rows past the last segment keep the
// poison.
inline void expect_padding(const char* what, const RowLayout& rows, const std::vector<int>& counts,
                           size_t cols, const std::vector<uint16_t>& out) {
  size_t nonzero = 0, past_end = 0;
  for (size_t e = 0; e < counts.size(); ++e) {
    for (size_t row = size_t(rows.offset[e]) + size_t(counts[e]); row < size_t(rows.offset[e + 1]);
         ++row) {
      for (size_t col = 0; col < cols; ++col) nonzero += (out[row * cols + col] & 0x7FFF) != 0;
    }
  }
  for (size_t row = size_t(rows.offset.back()); row < size_t(rows.capacity); ++row) {
    for (size_t col = 0; col < cols; ++col) past_end += out[row * cols + col] != kPoison;
  }
  EXPECT_EQ(nonzero, 0u) << what << ": padding rows must hold zeros";
  EXPECT_EQ(past_end, 0u) << what << ": rows past expert_offset[L] must be left untouched";
}

// The bounds are tight enough to catch a small systematic error: kChecksCase's `out`
// ([capacity][cols]) passes its checks, and fails them with its largest expert (7: 300 rows)
// 0.5% off.
inline void expect_catches_expert_off(const char* what, const RowLayout& rows, size_t cols,
                                      const std::vector<double>& ref, const std::vector<uint16_t>& out,
                                      const caracal::test::ErrorBound& bound) {
  const auto failures = [&](const std::vector<uint16_t>& v) {
    return close_failures(what, rows, kChecksCase.counts, cols, ref, v, bound, false);
  };
  ASSERT_EQ(failures(out), std::vector<std::string>{}) << "the real " << what << " passes";
  EXPECT_NE(failures(scaled_rows(out, size_t(rows.offset[7]), 300, cols, 1.005f)), std::vector<std::string>{})
      << "an expert's " << what << " 0.5% off passed";
}

}  // namespace caracal::test::gemm
