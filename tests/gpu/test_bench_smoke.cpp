// `caracal bench` end to end on a tiny shape: validation against the fp64 reference, timing, the
// baselines and --json (the binary is caracal-bench, which `caracal bench` execs).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "gpu/gpu_test_util.hpp"

namespace {

// $CARACAL_BENCH when set; else caracal-bench of this test's build tree (<build>/tests/..), which
// still works when the build tree moved (the device machine); else the path CMake compiled in.
std::string bench_path() {
  const char* env = std::getenv("CARACAL_BENCH");
  if (env && *env) return env;
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n > 0) {
    self[n] = '\0';
    std::string dir(self);
    dir = dir.substr(0, dir.rfind('/'));  // <build>/tests
    const std::string candidate = dir.substr(0, dir.rfind('/')) + "/caracal-bench";
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return CARACAL_BENCH_PATH;
}

struct BenchRun {
  int exit_code = -1;
  std::string out;
  nlohmann::json json;
};

BenchRun run_bench(const std::string& args) {
  const std::string stem = ::testing::TempDir() + "/caracal_bench_smoke_" + std::to_string(getpid()) + "_" +
                           std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
                           ::testing::UnitTest::GetInstance()->current_test_info()->name();
  const std::string json = stem + ".json", out = stem + ".out";
  const std::string cmd = bench_path() + " " + args + " --quiet --json " + json + " >" + out + " 2>&1";
  const int status = std::system(cmd.c_str());
  BenchRun r;
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  std::stringstream ss;
  ss << std::ifstream(out).rdbuf();
  r.out = ss.str();
  std::ifstream f(json);
  if (f) r.json = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
  std::remove(json.c_str());
  std::remove(out.c_str());
  return r;
}

const char* kTinyShape = "--hidden 256 --intermediate 128 --experts 8 --top-k 2 --shared-intermediate 128 "
                         "--warmup 1 --reps 3";

void expect_pass(const nlohmann::json& p, const char* name) {
  SCOPED_TRACE(name);
  ASSERT_TRUE(p.is_object());
  EXPECT_GT(p.at("ms").get<double>(), 0.0);
  EXPECT_GT(p.at("tflops").get<double>(), 0.0);
  EXPECT_GT(p.at("tokens_per_s").get<double>(), 0.0);
}

void expect_report(const BenchRun& r, int64_t tokens, int64_t ep, bool nccl_baseline) {
  ASSERT_EQ(r.exit_code, 0) << r.out;
  ASSERT_TRUE(r.json.is_object()) << "no JSON; output:\n" << r.out;
  EXPECT_EQ(r.json.at("ep").get<int64_t>(), ep);
  EXPECT_TRUE(r.json.at("validation").at("ran").get<bool>());
  EXPECT_TRUE(r.json.at("validation").at("passed").get<bool>()) << r.json.at("validation").dump(2);
  const nlohmann::json& runs = r.json.at("runs");
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].at("tokens_per_rank").get<int64_t>(), tokens);
  expect_pass(runs[0].at("forward"), "forward");
  expect_pass(runs[0].at("backward"), "backward");
  expect_pass(runs[0].at("fwd_bwd"), "fwd_bwd");
  EXPECT_TRUE(runs[0].at("baselines").at("cublas_dense").at("available").get<bool>());
  EXPECT_EQ(runs[0].at("baselines").at("nccl_exchange_plus_gemms").at("available").get<bool>(), nccl_baseline)
      << runs[0].at("baselines").dump(2);
  EXPECT_NE(r.out.find("fwd+bwd"), std::string::npos) << r.out;
}

TEST(BenchSmoke, LoopbackTwoRanks) {
  CARACAL_REQUIRE_GPU();
  expect_report(run_bench(std::string(kTinyShape) + " --ep 2 --tokens 256 --routing zipf:1.2"), 256, 2, false);
}

TEST(BenchSmoke, LoopbackOneRankWithTheNcclBaseline) {
  CARACAL_REQUIRE_GPU();
  const BenchRun r = run_bench(std::string(kTinyShape) + " --ep 1 --tokens 128");
  expect_report(r, 128, 1, true);
  // The fused passes over the baseline's GEMMs alone (the issues' data-movement-hidden metric).
  const nlohmann::json& nccl = r.json.at("runs")[0].at("baselines").at("nccl_exchange_plus_gemms");
  EXPECT_GT(nccl.at("gemms_alone_forward_ms").get<double>(), 0.0);
  EXPECT_GT(nccl.at("forward_over_gemms_alone").get<double>(), 0.0);
  EXPECT_GT(nccl.at("backward_over_gemms_alone").get<double>(), 0.0);
  EXPECT_NE(r.out.find("over the GEMMs alone"), std::string::npos) << r.out;
}

// CUDA-graph replays of the layer's calls, on a ring small enough for several macrobatches.
TEST(BenchSmoke, GraphReplaysOnASmallRing) {
  CARACAL_REQUIRE_GPU();
  const BenchRun r = run_bench(std::string(kTinyShape) + " --ep 2 --tokens 256 --graph --ring-rows 128");
  expect_report(r, 256, 2, false);
  EXPECT_TRUE(r.json.at("graph").get<bool>());
  EXPECT_EQ(r.json.at("ring_rows").get<int64_t>(), 128);
}

// bf16 weight gradients (the PyTorch module's path) for the layer and the GEMMs-alone baseline, on a
// ring small enough for several macrobatches (the gradients' fp32 partials between them).
TEST(BenchSmoke, Bf16WeightGradientsOnASmallRing) {
  CARACAL_REQUIRE_GPU();
  const BenchRun r = run_bench(std::string(kTinyShape) + " --ep 1 --tokens 256 --ring-rows 128 --bf16-weight-grads");
  expect_report(r, 256, 1, true);
  EXPECT_EQ(r.json.at("weight_grads").get<std::string>(), "bf16");
  EXPECT_GT(r.json.at("runs")[0].at("baselines").at("nccl_exchange_plus_gemms").at("gemms_alone_backward_ms").get<double>(),
            0.0);
}

// --rounds: the layer and the baselines timed in turn; every figure the median over the rounds, and
// ours over the GEMMs alone given round by round.
TEST(BenchSmoke, RoundsReportTheMedianOfEachFigure) {
  CARACAL_REQUIRE_GPU();
  const BenchRun r = run_bench(std::string(kTinyShape) + " --ep 1 --tokens 128 --rounds 3");
  expect_report(r, 128, 1, true);
  EXPECT_EQ(r.json.at("rounds").get<int>(), 3);
  const nlohmann::json& run = r.json.at("runs")[0];
  ASSERT_EQ(run.at("rounds").size(), 3u);
  ASSERT_EQ(run.at("backward_over_gemms_alone_by_round").size(), 3u);
  ASSERT_EQ(run.at("forward_over_gemms_alone_by_round").size(), 3u);
  // The median of three is one of them: the middle one.
  std::vector<double> backward;
  for (const nlohmann::json& round : run.at("rounds")) backward.push_back(round.at("backward").at("ms").get<double>());
  std::sort(backward.begin(), backward.end());
  EXPECT_EQ(run.at("backward").at("ms").get<double>(), backward[1]);
  // Each round's ratio is that round's backward over that round's GEMMs alone.
  for (size_t i = 0; i < 3; ++i) {
    const nlohmann::json& round = run.at("rounds")[i];
    const nlohmann::json& nccl = round.at("baselines").at("nccl_exchange_plus_gemms");
    EXPECT_DOUBLE_EQ(run.at("backward_over_gemms_alone_by_round")[i].get<double>(),
                     nccl.at("backward_over_gemms_alone").get<double>());
    EXPECT_DOUBLE_EQ(run.at("forward_over_gemms_alone_by_round")[i].get<double>(),
                     nccl.at("forward_over_gemms_alone").get<double>());
  }
  EXPECT_NE(r.out.find("by round: forward"), std::string::npos) << r.out;
}

TEST(BenchSmoke, ProfileStepRunsOneStepWithoutTiming) {
  CARACAL_REQUIRE_GPU();
  const BenchRun r = run_bench(std::string(kTinyShape) + " --ep 2 --tokens 256 --no-validate --profile-step");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("profiled T=256: one forward and backward"), std::string::npos) << r.out;
  EXPECT_TRUE(r.json.at("profiled").get<bool>());
  EXPECT_FALSE(r.json.contains("runs"));
}

TEST(BenchSmoke, NcclOneRank) {
  CARACAL_REQUIRE_GPU();
  expect_report(run_bench(std::string(kTinyShape) + " --ep 1 --backend nccl --tokens 128"), 128, 1, true);
}

TEST(BenchSmoke, SweepWritesOneRunPerTokenCount) {
  CARACAL_REQUIRE_GPU();
  const BenchRun r = run_bench(std::string(kTinyShape) + " --ep 2 --sweep 64,128 --no-validate");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  ASSERT_TRUE(r.json.is_object()) << r.out;
  EXPECT_FALSE(r.json.at("validation").at("ran").get<bool>());
  ASSERT_EQ(r.json.at("runs").size(), 2u);
  EXPECT_EQ(r.json.at("runs")[1].at("tokens_per_rank").get<int64_t>(), 128);
}

}  // namespace
