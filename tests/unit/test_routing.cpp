#include <fcntl.h>
#include <gtest/gtest.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "caracal/error.hpp"
#include "caracal/routing.hpp"

namespace caracal {
namespace {

// Runs `fn`, expects a caracal::Error and that its message contains every one of `parts`.
void expect_error(const std::function<void()>& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "expected caracal::Error mentioning '" << parts.back() << "'";
  } catch (const Error& e) {
    for (const std::string& part : parts) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
          << "message '" << e.what() << "' does not mention '" << part << "'";
    }
  }
}

RoutingSpec spec_of(RoutingKind kind, uint64_t seed, double zipf_exponent = 1.0) {
  RoutingSpec spec;
  spec.kind = kind;
  spec.seed = seed;
  spec.zipf_exponent = zipf_exponent;
  return spec;
}

std::vector<int64_t> tokens_per_expert(const Routing& r, int64_t num_experts) {
  std::vector<int64_t> counts(static_cast<size_t>(num_experts), 0);
  for (const int32_t id : r.topk_idx) {
    if (id >= 0) ++counts[static_cast<size_t>(id)];
  }
  return counts;
}

void expect_distinct_experts_per_token(const Routing& r, int64_t num_experts) {
  ASSERT_EQ(static_cast<int64_t>(r.topk_idx.size()), r.world_size * r.tokens_per_rank * r.top_k);
  for (int64_t rank = 0; rank < r.world_size; ++rank) {
    for (int64_t t = 0; t < r.tokens_per_rank; ++t) {
      std::set<int32_t> seen;
      for (int64_t s = 0; s < r.top_k; ++s) {
        const int32_t id = r.at(rank, t, s);
        ASSERT_GE(id, 0);
        ASSERT_LT(id, num_experts);
        ASSERT_TRUE(seen.insert(id).second) << "rank " << rank << " token " << t << " repeats expert " << id;
      }
    }
  }
}

uint64_t fresh_seed() { return (uint64_t{std::random_device{}()} << 32) | std::random_device{}(); }

// ---- Generators ----------------------------------------------------------------------------

TEST(Routing, UniformPicksDistinctExperts) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (const auto& [k, e] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {8, 256}, {8, 8}, {5, 7}, {10, 512}}) {
    const Routing r = make_routing(spec_of(RoutingKind::kUniform, seed), 3, 200, k, e);
    EXPECT_EQ(r.world_size, 3);
    EXPECT_EQ(r.tokens_per_rank, 200);
    EXPECT_EQ(r.top_k, k);
    expect_distinct_experts_per_token(r, e);
    EXPECT_NO_THROW(r.validate(e));
  }
}

TEST(Routing, UniformIsRoughlyFlat) {
  const Routing r = make_routing(spec_of(RoutingKind::kUniform, fresh_seed()), 8, 4096, 8, 256);
  const std::vector<int64_t> counts = tokens_per_expert(r, 256);
  const double mean = 8.0 * 4096 * 8 / 256;  // 1024
  const auto [lo, hi] = std::minmax_element(counts.begin(), counts.end());
  EXPECT_GT(static_cast<double>(*lo), 0.8 * mean);
  EXPECT_LT(static_cast<double>(*hi), 1.2 * mean);
}

TEST(Routing, ZipfPicksDistinctExpertsForAnyExponent) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  // Large exponents exercise the exact draw that takes over when rejection stalls; k == E
  // forces every expert to be drawn.
  for (const double exponent : {0.01, 0.5, 1.0, 2.0, 5.0, 60.0, 1000.0, 1e6}) {
    for (const auto& [k, e] : std::vector<std::pair<int64_t, int64_t>>{{8, 256}, {8, 8}, {6, 7}, {1, 3}}) {
      SCOPED_TRACE("exponent " + std::to_string(exponent) + " k " + std::to_string(k) + " E " +
                   std::to_string(e));
      expect_distinct_experts_per_token(make_routing(spec_of(RoutingKind::kZipf, seed, exponent), 2, 100, k, e), e);
    }
  }
}

TEST(Routing, ZipfIsSkewedAndHotExpertsMoveWithTheSeed) {
  const int64_t experts = 256;
  std::set<int64_t> hottest;
  for (uint64_t seed = 0; seed < 8; ++seed) {
    const Routing r = make_routing(spec_of(RoutingKind::kZipf, seed, 1.2), 4, 2048, 8, experts);
    const std::vector<int64_t> counts = tokens_per_expert(r, experts);
    const double mean = 4.0 * 2048 * 8 / static_cast<double>(experts);
    const auto top = std::max_element(counts.begin(), counts.end());
    EXPECT_GT(static_cast<double>(*top), 10.0 * mean);
    // Some expert is (nearly) never picked at this skew.
    EXPECT_LT(static_cast<double>(*std::min_element(counts.begin(), counts.end())), 0.5 * mean);
    hottest.insert(top - counts.begin());
  }
  // The popularity order is a seeded permutation, so the hottest expert is not always the same.
  EXPECT_GT(hottest.size(), 1u);
}

TEST(Routing, ZipfSkewGrowsWithTheExponent) {
  double previous_top = 0;
  for (const double exponent : {0.3, 1.0, 2.0}) {
    const Routing r = make_routing(spec_of(RoutingKind::kZipf, 5, exponent), 2, 2048, 4, 64);
    const std::vector<int64_t> counts = tokens_per_expert(r, 64);
    const double top = static_cast<double>(*std::max_element(counts.begin(), counts.end()));
    EXPECT_GT(top, previous_top) << "exponent " << exponent;
    previous_top = top;
  }
}

// The draws must follow successive sampling without replacement: P(a, b, c, ...) =
// w_a / S * w_b / (S - w_a) * ..., with w = 1 / (rank + 1)^exponent. Checked with a chi-square
// test over every ordered tuple (fixed seeds; the bound is loose enough to never flake).
// Large exponents exercise the exact draw that replaces rejection sampling.
TEST(Routing, ZipfMatchesSuccessiveSamplingExactly) {
  struct Case {
    int64_t experts, k;
    double exponent;
  };
  for (const Case c : {Case{4, 3, 1.0}, Case{4, 4, 6.0}, Case{5, 3, 12.0}, Case{5, 2, 0.2}}) {
    SCOPED_TRACE("E=" + std::to_string(c.experts) + " k=" + std::to_string(c.k) + " exponent=" +
                 std::to_string(c.exponent));
    const int64_t tokens = 60000;
    const Routing r = make_routing(spec_of(RoutingKind::kZipf, 77, c.exponent), 1, tokens, c.k, c.experts);
    // Popularity rank of each expert, recovered from the draws: popular experts come up more
    // often and earlier, so score k - slot per appearance.
    std::vector<int64_t> score(static_cast<size_t>(c.experts), 0);
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t s = 0; s < c.k; ++s) score[static_cast<size_t>(r.at(0, t, s))] += c.k - s;
    }
    std::vector<int64_t> by_popularity(static_cast<size_t>(c.experts));
    std::iota(by_popularity.begin(), by_popularity.end(), 0);
    std::sort(by_popularity.begin(), by_popularity.end(), [&](int64_t a, int64_t b) { return score[a] > score[b]; });
    std::vector<int64_t> rank_of(static_cast<size_t>(c.experts));
    for (int64_t i = 0; i < c.experts; ++i) rank_of[by_popularity[i]] = i;

    std::map<std::vector<int64_t>, int64_t> observed;
    for (int64_t t = 0; t < tokens; ++t) {
      std::vector<int64_t> tuple;
      for (int64_t s = 0; s < c.k; ++s) tuple.push_back(rank_of[r.at(0, t, s)]);
      ++observed[tuple];
    }
    // Every ordered tuple of distinct ranks with its exact probability; tuples expected fewer
    // than 5 times are pooled into one cell.
    std::vector<double> weight(static_cast<size_t>(c.experts));
    for (int64_t i = 0; i < c.experts; ++i) weight[i] = std::pow(static_cast<double>(i + 1), -c.exponent);
    const double total = std::accumulate(weight.begin(), weight.end(), 0.0);
    std::vector<int64_t> ranks(static_cast<size_t>(c.experts));
    std::iota(ranks.begin(), ranks.end(), 0);
    double chi2 = 0, pooled_expected = 0;
    int64_t pooled_observed = 0, seen = 0;
    std::set<std::vector<int64_t>> tuples;
    do {
      const std::vector<int64_t> tuple(ranks.begin(), ranks.begin() + c.k);
      if (!tuples.insert(tuple).second) continue;
      double p = 1, left = total;
      for (const int64_t x : tuple) {
        p *= weight[x] / left;
        left -= weight[x];
      }
      const double expected = p * static_cast<double>(tokens);
      const int64_t got = observed.count(tuple) ? observed[tuple] : 0;
      seen += got;
      if (expected < 5) {
        pooled_expected += expected;
        pooled_observed += got;
      } else {
        chi2 += (static_cast<double>(got) - expected) * (static_cast<double>(got) - expected) / expected;
      }
    } while (std::next_permutation(ranks.begin(), ranks.end()));
    EXPECT_EQ(seen, tokens);  // nothing outside the distinct tuples
    if (pooled_expected > 0) {
      const double diff = static_cast<double>(pooled_observed) - pooled_expected;
      chi2 += diff * diff / std::max(pooled_expected, 1.0);
    }
    EXPECT_LT(chi2, 3.0 * static_cast<double>(tuples.size()) + 30) << "cells " << tuples.size();
  }
}

TEST(Routing, ZipfAtHugeExponentPicksThePopularityOrder) {
  // With exponent 1e6 the draw is deterministic: the k most popular experts, most popular first,
  // identical for every token.
  const Routing r = make_routing(spec_of(RoutingKind::kZipf, 3, 1e6), 2, 50, 5, 16);
  for (int64_t rank = 0; rank < 2; ++rank) {
    for (int64_t t = 0; t < 50; ++t) {
      for (int64_t s = 0; s < 5; ++s) ASSERT_EQ(r.at(rank, t, s), r.at(0, 0, s));
    }
  }
}

TEST(Routing, AllToOneSendsEverySlotToTheTarget) {
  RoutingSpec spec = spec_of(RoutingKind::kAllToOne, 1);
  spec.target_expert = 37;
  const Routing r = make_routing(spec, 4, 33, 8, 64);  // every slot, duplicates within tokens
  EXPECT_EQ(r.topk_idx.size(), 4u * 33 * 8);
  EXPECT_TRUE(std::all_of(r.topk_idx.begin(), r.topk_idx.end(), [](int32_t id) { return id == 37; }));
  EXPECT_NO_THROW(r.validate(64));
}

TEST(Routing, IsDeterministicPerSpecAndSeed) {
  for (const RoutingKind kind : {RoutingKind::kUniform, RoutingKind::kZipf, RoutingKind::kAllToOne}) {
    RoutingSpec spec = spec_of(kind, 1234, 1.5);
    spec.empty_slot_fraction = 0.2;
    const Routing a = make_routing(spec, 4, 300, 8, 64);
    const Routing b = make_routing(spec, 4, 300, 8, 64);
    EXPECT_EQ(a.topk_idx, b.topk_idx) << to_string(spec);
  }
}

TEST(Routing, DifferentSeedsGiveDifferentRoutings) {
  for (const RoutingKind kind : {RoutingKind::kUniform, RoutingKind::kZipf}) {
    const Routing a = make_routing(spec_of(kind, 1), 2, 100, 4, 64);
    const Routing b = make_routing(spec_of(kind, 2), 2, 100, 4, 64);
    EXPECT_NE(a.topk_idx, b.topk_idx);
  }
  RoutingSpec spec = spec_of(RoutingKind::kAllToOne, 1);
  spec.empty_slot_fraction = 0.5;
  const Routing a = make_routing(spec, 2, 100, 4, 64);
  spec.seed = 2;
  EXPECT_NE(a.topk_idx, make_routing(spec, 2, 100, 4, 64).topk_idx);
}

// Traces must be reproducible across standard libraries and releases: this pins the generator.
// If it changes on purpose, update the expected values and say so in the change log.
TEST(Routing, UniformGoldenValues) {
  const Routing r = make_routing(spec_of(RoutingKind::kUniform, 42), 1, 2, 4, 16);
  EXPECT_EQ(r.topk_idx, (std::vector<int32_t>{10, 12, 15, 7, 1, 4, 11, 12}));
}

TEST(Routing, EmptySlotFractionMasksSlots) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (const RoutingKind kind : {RoutingKind::kUniform, RoutingKind::kZipf, RoutingKind::kAllToOne}) {
    RoutingSpec spec = spec_of(kind, seed);
    const Routing full = make_routing(spec, 4, 1000, 8, 64);
    spec.empty_slot_fraction = 0.25;
    const Routing masked = make_routing(spec, 4, 1000, 8, 64);
    int64_t empty = 0;
    for (size_t i = 0; i < masked.topk_idx.size(); ++i) {
      if (masked.topk_idx[i] == -1) {
        ++empty;
      } else {
        // Emptying uses its own random stream: the surviving slots keep their experts.
        ASSERT_EQ(masked.topk_idx[i], full.topk_idx[i]);
      }
    }
    const double fraction = static_cast<double>(empty) / static_cast<double>(masked.topk_idx.size());
    EXPECT_NEAR(fraction, 0.25, 0.02) << to_string(spec);
    EXPECT_NO_THROW(masked.validate(64));
  }
}

TEST(Routing, EmptySlotFractionExtremes) {
  RoutingSpec spec = spec_of(RoutingKind::kZipf, 9);
  spec.empty_slot_fraction = 1.0;
  const Routing all_empty = make_routing(spec, 2, 64, 4, 16);
  EXPECT_TRUE(std::all_of(all_empty.topk_idx.begin(), all_empty.topk_idx.end(), [](int32_t id) { return id == -1; }));
  spec.empty_slot_fraction = 0.0;
  const Routing none_empty = make_routing(spec, 2, 64, 4, 16);
  EXPECT_TRUE(std::none_of(none_empty.topk_idx.begin(), none_empty.topk_idx.end(), [](int32_t id) { return id == -1; }));
}

// ---- Errors from the generator and validation -----------------------------------------------

TEST(Routing, MakeRoutingRejectsBadArguments) {
  const RoutingSpec uniform = spec_of(RoutingKind::kUniform, 0);
  expect_error([&] { make_routing(uniform, 0, 4, 2, 8); }, {"world_size", "at least 1", "0"});
  expect_error([&] { make_routing(uniform, 2, -3, 2, 8); }, {"tokens_per_rank", "-3"});
  expect_error([&] { make_routing(uniform, 2, 4, 0, 8); }, {"top_k", "at least 1"});
  expect_error([&] { make_routing(uniform, 2, 4, 2, 0); }, {"num_experts"});
  expect_error([&] { make_routing(uniform, 2, 4, 9, 8); }, {"top_k (9)", "num_experts (8)", "distinct"});
  expect_error([&] { make_routing(spec_of(RoutingKind::kZipf, 0), 2, 4, 9, 8); }, {"top_k", "distinct"});
  expect_error([&] { make_routing(uniform, 1 << 16, 1 << 16, 1, 8); }, {"2^31"});
  for (const double bad : {0.0, -1.0, std::numeric_limits<double>::infinity(), std::nan("")}) {
    expect_error([&] { make_routing(spec_of(RoutingKind::kZipf, 0, bad), 2, 4, 2, 8); },
                 {"zipf exponent", "> 0 and finite"});
  }
  for (const double bad : {-0.1, 1.5, std::nan("")}) {
    RoutingSpec spec = uniform;
    spec.empty_slot_fraction = bad;
    expect_error([&] { make_routing(spec, 2, 4, 2, 8); }, {"empty_slot_fraction", "[0, 1]"});
  }
  for (const int32_t bad : {-1, 8, 1000}) {
    RoutingSpec spec = spec_of(RoutingKind::kAllToOne, 0);
    spec.target_expert = bad;
    expect_error([&] { make_routing(spec, 2, 4, 2, 8); }, {"target expert", "[0, num_experts=8)", std::to_string(bad)});
  }
  // All-to-one repeats the expert within a token, so top_k may exceed num_experts.
  EXPECT_NO_THROW(make_routing(spec_of(RoutingKind::kAllToOne, 0), 2, 4, 9, 8));
}

TEST(Routing, ValidateRejectsBadSizesAndIds) {
  Routing r = make_routing(spec_of(RoutingKind::kUniform, 0), 2, 3, 2, 8);
  EXPECT_NO_THROW(r.validate(8));
  expect_error([&] { r.validate(4); }, {"outside [-1, num_experts=4)"});
  Routing bad_id = r;
  bad_id.topk_idx[1 * 6 + 2 * 2 + 1] = -2;  // rank 1, token 2, slot 1
  expect_error([&] { bad_id.validate(8); }, {"[rank 1][token 2][slot 1]", "-2"});
  Routing bad_size = r;
  bad_size.topk_idx.pop_back();
  expect_error([&] { bad_size.validate(8); }, {"11 entries", "12"});
  Routing bad_world = r;
  bad_world.world_size = 0;
  expect_error([&] { bad_world.validate(8); }, {"world_size"});
}

// ---- Text form -----------------------------------------------------------------------------

TEST(RoutingSpecText, ParsesEveryAcceptedForm) {
  EXPECT_EQ(parse_routing_spec("uniform").kind, RoutingKind::kUniform);
  const RoutingSpec zipf = parse_routing_spec("zipf");
  EXPECT_EQ(zipf.kind, RoutingKind::kZipf);
  EXPECT_EQ(zipf.zipf_exponent, 1.0);
  EXPECT_EQ(parse_routing_spec("zipf:1.2").zipf_exponent, 1.2);
  EXPECT_EQ(parse_routing_spec("zipf:2e-1").zipf_exponent, 0.2);
  const RoutingSpec one = parse_routing_spec("all-to-one");
  EXPECT_EQ(one.kind, RoutingKind::kAllToOne);
  EXPECT_EQ(one.target_expert, 0);
  EXPECT_EQ(parse_routing_spec("all-to-one:17").target_expert, 17);
}

TEST(RoutingSpecText, PrintAndParseRoundTrip) {
  for (const std::string text : {"uniform", "zipf:1", "zipf:1.2", "zipf:0.3", "zipf:1e-05", "all-to-one:0", "all-to-one:255"}) {
    EXPECT_EQ(to_string(parse_routing_spec(text)), text);
  }
  std::mt19937_64 rng(fresh_seed());
  for (int i = 0; i < 200; ++i) {
    RoutingSpec spec;
    spec.kind = RoutingKind::kZipf;
    spec.zipf_exponent = std::ldexp(static_cast<double>(rng() >> 11), -53) * 4 + 1e-9;
    EXPECT_EQ(parse_routing_spec(to_string(spec)).zipf_exponent, spec.zipf_exponent) << to_string(spec);
  }
}

TEST(RoutingSpecText, RejectsBadText) {
  for (const std::string text : {"pareto", "", "Uniform", "uniform:3", "zipf1", "all-to-one-5"}) {
    expect_error([&] { parse_routing_spec(text, "--routing"); },
                 {"--routing", "'" + text + "'", "'uniform', 'zipf', 'zipf:<exponent>', 'all-to-one' or 'all-to-one:<expert>'"});
  }
  for (const std::string text : {"zipf:", "zipf:0", "zipf:-1", "zipf:abc", "zipf:1.5x", "zipf:inf", "zipf:nan", "zipf: 1"}) {
    expect_error([&] { parse_routing_spec(text, "--routing"); }, {"--routing", "zipf exponent", "> 0 and finite", text});
  }
  for (const std::string text : {"all-to-one:", "all-to-one:-1", "all-to-one:x", "all-to-one:3.5", "all-to-one:99999999999"}) {
    expect_error([&] { parse_routing_spec(text); }, {"routing", "non-negative integer", text});
  }
}

// ---- .npy traces ---------------------------------------------------------------------------

class NpyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("caracal_test_routing_" + std::to_string(fresh_seed()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    for (std::thread& writer : writers_) writer.join();
    std::filesystem::remove_all(dir_);
  }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // Writes a .npy file from its parts; the header dict is padded to a 64-byte boundary.
  std::string write_npy(const std::string& name, const std::string& dict, const std::string& data,
                        int major = 1, const std::string& magic = "\x93NUMPY") const {
    std::string header = dict;
    const size_t length_bytes = major == 1 ? 2 : 4;
    const size_t unpadded = magic.size() + 2 + length_bytes + header.size() + 1;
    header.append((64 - unpadded % 64) % 64, ' ');
    header.push_back('\n');
    std::string bytes = magic;
    bytes.push_back(static_cast<char>(major));
    bytes.push_back('\0');
    for (size_t i = 0; i < length_bytes; ++i) bytes.push_back(static_cast<char>(header.size() >> (8 * i) & 0xff));
    bytes += header + data;
    return write_bytes(name, bytes);
  }

  std::string write_bytes(const std::string& name, const std::string& bytes) const {
    const std::string p = path(name);
    std::ofstream(p, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return p;
  }

  // A FIFO that a thread of the test writes `bytes` into once the reader opens it: a stream that
  // cannot seek, as `--trace /dev/stdin` on a pipe or a process substitution. A reader that stops
  // early ends the write (EPIPE; SIGPIPE is blocked in the writer).
  std::string fifo_with(const std::string& name, std::string bytes) {
    const std::string p = path(name);
    EXPECT_EQ(mkfifo(p.c_str(), 0600), 0) << p;
    writers_.emplace_back([p, bytes = std::move(bytes)] {
      sigset_t pipe_signal;
      sigemptyset(&pipe_signal);
      sigaddset(&pipe_signal, SIGPIPE);
      pthread_sigmask(SIG_BLOCK, &pipe_signal, nullptr);
      const int fd = open(p.c_str(), O_WRONLY);
      if (fd < 0) return;
      for (size_t done = 0; done < bytes.size();) {
        const ssize_t n = write(fd, bytes.data() + done, bytes.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        done += static_cast<size_t>(n);
      }
      close(fd);
    });
    return p;
  }

  std::string bytes_of(const std::string& file) const {
    std::ifstream in(file, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }

  static std::string int32_data(const std::vector<int32_t>& values) {
    return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(int32_t));
  }

  // The header and data of a valid [1, 2, 2] file, for the bad inputs that spoil one of them.
  const std::string good_dict_ = "{'descr': '<i4', 'fortran_order': False, 'shape': (1, 2, 2), }";
  const std::string good_data_ = int32_data({0, 1, 2, 3});

  // An input load_routing_npy must reject (a file's path, or the bytes of a stream) and what the
  // error must mention besides the path.
  struct BadInput {
    std::string name;
    std::string input;
    std::vector<std::string> mentions;
  };

  std::filesystem::path dir_;
  std::vector<std::thread> writers_;
};

TEST_F(NpyTest, SaveThenLoadGivesTheSameRouting) {
  RoutingSpec spec = spec_of(RoutingKind::kZipf, fresh_seed());
  spec.empty_slot_fraction = 0.1;
  const Routing r = make_routing(spec, 3, 111, 6, 48);
  const std::string p = path("trace.npy");
  save_routing_npy(r, p);
  const Routing back = load_routing_npy(p);
  EXPECT_EQ(back.world_size, 3);
  EXPECT_EQ(back.tokens_per_rank, 111);
  EXPECT_EQ(back.top_k, 6);
  EXPECT_EQ(back.topk_idx, r.topk_idx);
  // The data starts on a 64-byte boundary, as NumPy writes it.
  EXPECT_EQ((std::filesystem::file_size(p) - r.topk_idx.size() * 4) % 64, 0u);
}

TEST_F(NpyTest, ReadsHeadersWrittenDifferently) {
  const std::vector<int32_t> values = {0, 1, -1, 3, 2, 2};
  const std::string data = int32_data(values);
  for (const std::string dict : {"{'descr': '<i4', 'fortran_order': False, 'shape': (1, 3, 2), }",
                                 "{'shape':(1,3,2),'fortran_order':False,'descr':'<i4'}",
                                 "{ \"descr\" : \"<i4\" ,\n 'fortran_order' : False , 'shape' : ( 1 , 3 , 2 , ) , }",
                                 "{'descr': '<i4', 'fortran_order': False, 'shape': (1L, 3L, 2L)}"}) {
    for (const int major : {1, 2, 3}) {
      const Routing r = load_routing_npy(write_npy("ok.npy", dict, data, major));
      EXPECT_EQ(r.world_size, 1);
      EXPECT_EQ(r.tokens_per_rank, 3);
      EXPECT_EQ(r.top_k, 2);
      EXPECT_EQ(r.topk_idx, values) << dict << " v" << major;
    }
  }
}

TEST_F(NpyTest, ReportsProgressWhileReading) {
  // 5 * 1024 * 1024 int32 = 20 MiB: more than one 16 MiB chunk.
  Routing r;
  r.world_size = 5;
  r.tokens_per_rank = 1024 * 128;
  r.top_k = 8;
  r.topk_idx.assign(static_cast<size_t>(5 * 1024 * 1024), 7);
  r.topk_idx.back() = -1;
  const std::string p = path("big.npy");
  save_routing_npy(r, p);
  std::vector<std::pair<int64_t, int64_t>> calls;
  const Routing back = load_routing_npy(p, [&](int64_t done, int64_t total) { calls.emplace_back(done, total); });
  EXPECT_EQ(back.topk_idx, r.topk_idx);
  const int64_t total = static_cast<int64_t>(r.topk_idx.size() * sizeof(int32_t));
  ASSERT_GE(calls.size(), 2u);
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(calls[i].second, total);
    if (i > 0) {
      EXPECT_GT(calls[i].first, calls[i - 1].first);
    }
  }
  EXPECT_EQ(calls.back().first, total);
}

TEST_F(NpyTest, RejectsBadFilesNamingThePathAndTheProblem) {
  const std::vector<BadInput> files = {
      {"missing", path("does_not_exist.npy"), {"cannot open"}},
      {"empty file", write_bytes("empty.npy", ""), {"not a .npy file"}},
      {"wrong magic", write_bytes("text.npy", "hello, this is not numpy at all"), {"not a .npy file"}},
      {"version 4.0", write_npy("v4.npy", good_dict_, good_data_, 4), {"version 4.0", "1.0, 2.0 or 3.0"}},
      {"int64 dtype", write_npy("i8.npy", "{'descr': '<i8', 'fortran_order': False, 'shape': (1, 2, 2), }", good_data_ + good_data_),
       {"dtype '<i8'", "'<i4'", "int32"}},
      {"float dtype", write_npy("f4.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2, 2), }", good_data_),
       {"dtype '<f4'", "'<i4'"}},
      {"big-endian", write_npy("be.npy", "{'descr': '>i4', 'fortran_order': False, 'shape': (1, 2, 2), }", good_data_),
       {"dtype '>i4'"}},
      {"fortran order", write_npy("f.npy", "{'descr': '<i4', 'fortran_order': True, 'shape': (1, 2, 2), }", good_data_),
       {"Fortran order"}},
      {"2-D", write_npy("2d.npy", "{'descr': '<i4', 'fortran_order': False, 'shape': (2, 2), }", good_data_),
       {"(2, 2)", "2-D", "expected 3-D"}},
      {"1-D", write_npy("1d.npy", "{'descr': '<i4', 'fortran_order': False, 'shape': (4,), }", good_data_),
       {"(4,)", "1-D"}},
      {"zero dim", write_npy("zero.npy", "{'descr': '<i4', 'fortran_order': False, 'shape': (1, 0, 2), }", ""),
       {"zero dimension"}},
      {"truncated", write_npy("short.npy", good_dict_, good_data_.substr(0, 10)), {"truncated", "16 bytes", "10"}},
      {"trailing garbage", write_npy("long.npy", good_dict_, good_data_ + "junk"), {"4 bytes of trailing garbage"}},
      {"too many routes", write_npy("huge.npy", "{'descr': '<i4', 'fortran_order': False, 'shape': (65536, 65536, 1), }", good_data_),
       {"2^31"}},
      {"unknown key", write_npy("key.npy", "{'descr': '<i4', 'fortran_order': False, 'shape': (1, 2, 2), 'x': 'y'}", good_data_),
       {"unexpected key 'x'"}},
      {"missing key", write_npy("nokey.npy", "{'descr': '<i4', 'shape': (1, 2, 2)}", good_data_), {"'fortran_order'"}},
      {"malformed header", write_npy("bad.npy", "{'descr': '<i4', 'fortran_order': False, 'shape': (1, 2, 2)", good_data_),
       {"malformed .npy header"}},
      {"structured dtype", write_npy("rec.npy", "{'descr': [('a', '<i4')], 'fortran_order': False, 'shape': (1, 2, 2)}", good_data_),
       {"malformed .npy header"}},
      {"header cut short", write_bytes("cut.npy", std::string("\x93NUMPY\x01\x00\x40\x00{'descr'", 17)),
       {"file ends inside the .npy header"}},
      {"id below -1", write_npy("neg.npy", good_dict_, int32_data({0, 1, -7, 3})), {"[0, 1, 0]", "-7", "-1 for an empty slot"}},
  };
  for (const BadInput& c : files) {
    SCOPED_TRACE(c.name);
    std::vector<std::string> mentions = c.mentions;
    mentions.push_back(c.input);
    expect_error([&] { load_routing_npy(c.input); }, mentions);
  }
}

TEST_F(NpyTest, ReadsAStreamThatCannotSeek) {
  // 20 MiB: more than one 16 MiB chunk, with progress as from a file.
  Routing r;
  r.world_size = 5;
  r.tokens_per_rank = 1024 * 128;
  r.top_k = 8;
  r.topk_idx.resize(static_cast<size_t>(5 * 1024 * 1024));
  for (size_t i = 0; i < r.topk_idx.size(); ++i) r.topk_idx[i] = static_cast<int32_t>(i % 97) - 1;
  save_routing_npy(r, path("big.npy"));
  std::vector<std::pair<int64_t, int64_t>> calls;
  const Routing back = load_routing_npy(fifo_with("big.fifo", bytes_of(path("big.npy"))),
                                        [&](int64_t done, int64_t total) { calls.emplace_back(done, total); });
  EXPECT_EQ(back.world_size, 5);
  EXPECT_EQ(back.tokens_per_rank, 1024 * 128);
  EXPECT_EQ(back.top_k, 8);
  EXPECT_EQ(back.topk_idx, r.topk_idx);
  ASSERT_GE(calls.size(), 2u);
  EXPECT_EQ(calls.back(), std::make_pair(int64_t{20} << 20, int64_t{20} << 20));

  const std::vector<int32_t> values = {0, 1, -1, 3, 2, 2};
  for (const int major : {1, 2, 3}) {
    const std::string file =
        write_npy("small.npy", "{'descr': '<i4', 'fortran_order': False, 'shape': (1, 3, 2), }", int32_data(values), major);
    EXPECT_EQ(load_routing_npy(fifo_with("small" + std::to_string(major) + ".fifo", bytes_of(file))).topk_idx, values);
  }
}

TEST_F(NpyTest, RejectsBadStreamsAsItRejectsBadFiles) {
  const std::vector<BadInput> streams = {
      {"empty", "", {"not a .npy file"}},
      {"int64 dtype", bytes_of(write_npy("i8.npy", "{'descr': '<i8', 'fortran_order': False, 'shape': (1, 2, 2), }", good_data_ + good_data_)),
       {"dtype '<i8'", "'<i4'"}},
      {"fortran order", bytes_of(write_npy("f.npy", "{'descr': '<i4', 'fortran_order': True, 'shape': (1, 2, 2), }", good_data_)),
       {"Fortran order"}},
      {"2-D", bytes_of(write_npy("2d.npy", "{'descr': '<i4', 'fortran_order': False, 'shape': (2, 2), }", good_data_)),
       {"(2, 2)", "expected 3-D"}},
      {"truncated", bytes_of(write_npy("short.npy", good_dict_, good_data_.substr(0, 10))), {"truncated", "16 bytes", "10"}},
      {"trailing garbage", bytes_of(write_npy("long.npy", good_dict_, good_data_ + "junk")),
       {"trailing garbage", "16 data bytes"}},
      // 8 GiB promised, 16 bytes sent: refused once the stream ends, without taking the 8 GiB.
      {"huge shape, little data",
       bytes_of(write_npy("huge.npy", "{'descr': '<i4', 'fortran_order': False, 'shape': (46340, 46340, 1), }", good_data_)),
       {"truncated", "8589582400 bytes", "16"}},
      {"too many routes",
       bytes_of(write_npy("many.npy", "{'descr': '<i4', 'fortran_order': False, 'shape': (65536, 65536, 1), }", good_data_)),
       {"2^31"}},
      {"header cut short", std::string("\x93NUMPY\x01\x00\x40\x00{'descr'", 17), {"file ends inside the .npy header"}},
      {"header length past the end", std::string("\x93NUMPY\x02\x00\xff\xff\xff\xff{'descr'", 20),
       {"file ends inside the .npy header"}},
      {"id below -1", bytes_of(write_npy("neg.npy", good_dict_, int32_data({0, 1, -7, 3}))), {"[0, 1, 0]", "-7"}},
  };
  for (size_t i = 0; i < streams.size(); ++i) {
    const BadInput& c = streams[i];
    SCOPED_TRACE(c.name);
    const std::string fifo = fifo_with("bad" + std::to_string(i) + ".fifo", c.input);
    std::vector<std::string> mentions = c.mentions;
    mentions.push_back(fifo);
    expect_error([&] { load_routing_npy(fifo); }, mentions);
  }
}

TEST_F(NpyTest, SaveRejectsInconsistentRoutingAndUnwritablePath) {
  Routing r = make_routing(spec_of(RoutingKind::kUniform, 0), 1, 4, 2, 8);
  r.topk_idx.pop_back();
  expect_error([&] { save_routing_npy(r, path("x.npy")); }, {"7 entries"});
  const std::string unwritable = path("no_such_dir/x.npy");
  expect_error([&] { save_routing_npy(make_routing(spec_of(RoutingKind::kUniform, 0), 1, 4, 2, 8), unwritable); },
               {unwritable, "cannot open"});
}

}  // namespace
}  // namespace caracal
