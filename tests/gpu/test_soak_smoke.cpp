// caracal-soak end to end on a small shape with every check on: the fp64 reference every few steps,
// CUDA-graph replays, v1 and the fused path compared, a stall with reset() mid-soak; T·k odd, so
// that d_topk_scores ends in a half word. The checksum file must not depend on --graph or
// --stall-at (nor, for its fused lines, on --path both), and an NCCL world of two GPUs writes the
// loopback world's.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "gpu/gpu_test_util.hpp"
#include "gpu/tool_path.hpp"

namespace {

std::string soak_path() { return caracal::test::tool_path("CARACAL_SOAK", "caracal-soak", CARACAL_SOAK_PATH); }

std::string slurp(const std::string& path) {
  std::stringstream ss;
  ss << std::ifstream(path).rdbuf();
  return ss.str();
}

struct SoakRun {
  int exit_code = -1;
  std::string out;
  std::string checksums;
  nlohmann::json json;
};

SoakRun run_soak(const std::string& args) {
  static int calls = 0;
  const std::string stem =
      ::testing::TempDir() + "/caracal_soak_smoke_" + std::to_string(getpid()) + "_" + std::to_string(calls++);
  const std::string json = stem + ".json", out = stem + ".out", sums = stem + ".txt";
  const std::string cmd = soak_path() + " " + args + " --checksums " + sums + " --json " + json + " >" + out + " 2>&1";
  const int status = std::system(cmd.c_str());
  SoakRun r;
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  r.out = slurp(out);
  r.checksums = slurp(sums);
  std::ifstream f(json);
  if (f) r.json = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
  for (const std::string& p : {json, out, sums}) std::remove(p.c_str());
  return r;
}

// T·k = 37·3 = 111 (odd). With kEveryThird, steps 0, 4, 8 and 9 are reference steps, and 7, which
// stalls.
const char* kSmall =
    "--ep 2 --steps 12 --hidden 256 --intermediate 128 --experts-per-rank 4 --top-k 3 --tokens 37 "
    "--shared-intermediate 192 --seed 5";
const char* kEveryThird = " --reference-every 3";

// The lines of `checksums` without a path tag (the fused path's).
std::string fused_lines(const std::string& checksums) {
  std::istringstream in(checksums);
  std::string line, out;
  while (std::getline(in, line)) {
    if (line.find(" v1 ") == std::string::npos) out += line + "\n";
  }
  return out;
}

void expect_passed(const SoakRun& r) {
  ASSERT_EQ(r.exit_code, 0) << r.out;
  ASSERT_TRUE(r.json.is_object()) << "no JSON; output:\n" << r.out;
  EXPECT_TRUE(r.json.at("passed").get<bool>()) << r.json.dump(2);
  EXPECT_EQ(r.json.at("nonfinite").get<uint64_t>(), 0u);
  EXPECT_TRUE(r.json.at("memory_flat").get<bool>());
  EXPECT_TRUE(r.json.at("failures").empty()) << r.json.at("failures").dump(2);
  EXPECT_FALSE(r.checksums.empty());
}

TEST(SoakSmoke, EveryCheckOnLoopback) {
  CARACAL_REQUIRE_GPU();
  const SoakRun all = run_soak(std::string(kSmall) + kEveryThird + " --graph --path both --stall-at 7");
  expect_passed(all);
  const nlohmann::json& j = all.json;
  EXPECT_EQ(j.at("reference").at("checked_steps").get<int64_t>(), 5) << "steps 0, 4, 8, 9 and the stalled 7";
  for (const char* output :
       {"y", "dx", "d_scores", "d_w_gate_up", "d_w_down", "d_shared_w_gate_up", "d_shared_w_down"}) {
    const nlohmann::json& e = j.at("reference").at("errors").at(output);
    EXPECT_LE(e.at("largest").get<double>(), e.at("bound").get<double>()) << output;
  }
  EXPECT_EQ(j.at("replays").get<int64_t>(), 10) << "steps 2 to 11";
  // Every gradient bitwise on every (step, rank) (y and dx too where the ring holds the step and
  // the fused backward sends a dx row per route; else within the bounds).
  const nlohmann::json& bitwise = j.at("v1_vs_fused").at("bitwise_equal");
  for (const char* output : {"d_scores", "d_w_gate_up", "d_w_down", "d_shared_w_gate_up", "d_shared_w_down"}) {
    EXPECT_EQ(bitwise.value(output, 0), 24) << output << ": 12 steps x 2 ranks";
  }
  const nlohmann::json& stall = j.at("stall");
  EXPECT_EQ(stall.at("step").get<int64_t>(), 7);
  EXPECT_NE(stall.at("raised").get<std::string>().find("waited for rank 1"), std::string::npos) << stall.dump(2);
  EXPECT_EQ(stall.at("fault_flags"), nlohmann::json({1.0, 1.0}));
  EXPECT_EQ(stall.at("fault_flags_after_reset"), nlohmann::json({0.0, 0.0}));
  EXPECT_EQ(stall.at("poisoned_outputs"), stall.at("outputs"));
  EXPECT_TRUE(stall.at("passed").get<bool>());

  // The same steps eagerly and without the stall: the same checksums, line for line.
  const SoakRun eager = run_soak(std::string(kSmall) + kEveryThird + " --path both");
  expect_passed(eager);
  EXPECT_EQ(all.checksums, eager.checksums) << "--graph and --stall-at changed a checksum";
  EXPECT_EQ(all.json.at("digest"), eager.json.at("digest"));
  // The fused path alone writes the fused lines of --path both.
  const SoakRun fused = run_soak(std::string(kSmall) + " --path fused --reference-every 0");
  expect_passed(fused);
  EXPECT_EQ(fused.checksums, fused_lines(eager.checksums));
  // And v1 alone checks out against the reference.
  expect_passed(run_soak(std::string(kSmall) + kEveryThird + " --path v1 --graph"));
}

TEST(SoakSmoke, NcclTwoGpusWriteTheLoopbackChecksums) {
  CARACAL_REQUIRE_GPUS(2);
  const SoakRun nccl = run_soak(std::string(kSmall) + kEveryThird + " --backend nccl --graph --path both");
  expect_passed(nccl);
  EXPECT_GT(nccl.json.at("reference").at("checked_steps").get<int64_t>(), 0);
  const SoakRun loopback = run_soak(std::string(kSmall) + kEveryThird + " --path both");
  expect_passed(loopback);
  EXPECT_EQ(nccl.checksums, loopback.checksums);
}

}  // namespace
