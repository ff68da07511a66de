// Runs the `caracal` binary (and caracal-soak, for its argument checks) as a user would and checks
// their output, exit codes and errors.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "caracal/routing.hpp"

namespace caracal {
namespace {

struct RunResult {
  int exit_code = -1;  // -1: killed by a signal
  std::string out, err;
};

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The binary under test: $CARACAL_CLI when set (the build tree moved, e.g. on the GPU machine),
// else the path CMake compiled in.
std::string cli_path() {
  const char* env = std::getenv("CARACAL_CLI");
  return env && *env ? env : CARACAL_CLI_PATH;
}

// caracal-soak: $CARACAL_SOAK when set, else the one next to the `caracal` under test, else the path
// CMake compiled in.
std::string soak_path() {
  const char* env = std::getenv("CARACAL_SOAK");
  if (env && *env) return env;
  const std::string cli = cli_path();
  const std::string sibling = cli.substr(0, cli.rfind('/') + 1) + "caracal-soak";
  return access(sibling.c_str(), X_OK) == 0 ? sibling : CARACAL_SOAK_PATH;
}

// Runs `program args`, its stdin piped from `piped_file` when one is given.
RunResult run_program(const std::string& program, const std::string& args, const std::string& piped_file = "") {
  // CTest runs tests in parallel processes: name the capture files after this process.
  static int calls = 0;
  const std::string stem = ::testing::TempDir() + "/caracal_cli_" + std::to_string(getpid()) + "_" +
                           std::to_string(calls++);
  const std::string out = stem + ".out", err = stem + ".err";
  const std::string cmd =
      (piped_file.empty() ? "" : "cat " + piped_file + " | ") + program + " " + args + " >" + out + " 2>" + err;
  const int status = std::system(cmd.c_str());
  RunResult r;
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  r.out = slurp(out);
  r.err = slurp(err);
  std::remove(out.c_str());
  std::remove(err.c_str());
  return r;
}

RunResult run_cli(const std::string& args, const std::string& piped_file = "") {
  return run_program(cli_path(), args, piped_file);
}

size_t count_lines(const std::string& s) {
  size_t n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "/" + std::to_string(getpid()) + "_" + name;
}

// A failing command exits non-zero (not by a signal) with exactly one error line naming `what`.
void expect_clean_error_of(const std::string& program, const std::string& args, const std::string& what) {
  SCOPED_TRACE(program + " " + args);
  const RunResult r = run_program(program, args);
  EXPECT_GT(r.exit_code, 0) << "stderr: " << r.err;
  EXPECT_LT(r.exit_code, 3) << "stderr: " << r.err;  // 3 = internal error
  EXPECT_EQ(count_lines(r.err), 1u) << "stderr: " << r.err;
  EXPECT_NE(r.err.find("error"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(what), std::string::npos) << "expected '" << what << "' in: " << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
}

void expect_clean_error(const std::string& args, const std::string& what) {
  expect_clean_error_of(cli_path(), args, what);
}

// What `caracal ARGS` prints, parsed as JSON; a fatal failure unless it exits 0.
void run_cli_json(const std::string& args, nlohmann::json& j) {
  const RunResult r = run_cli(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  j = nlohmann::json::parse(r.out);
}

TEST(Cli, PlanDeepSeekV3PrintsTheTable) {
  const RunResult r = run_cli("plan --model deepseek-v3 --ep 8 --tokens 4096");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* section : {"DeepSeek-V3", "routes received per rank", "minibatch", "Memory per rank",
                              "ring", "Roofline", "bound"})
    EXPECT_NE(r.out.find(section), std::string::npos) << section << "\n" << r.out;
}

TEST(Cli, PlanJsonParses) {
  nlohmann::json j;
  ASSERT_NO_FATAL_FAILURE(run_cli_json("plan --model kimi-k2 --ep 8 --tokens 4096 --routing zipf:1.2 --json", j));
  EXPECT_EQ(j["model"], "kimi-k2");
  EXPECT_EQ(j["world"]["ep"], 8);
  EXPECT_EQ(j["world"]["routing"].get<std::string>().rfind("zipf:1.2 (seed 1)", 0), 0u) << j["world"]["routing"];
  EXPECT_EQ(j["overlap"]["overlap_min_rows"], 2112);
  EXPECT_DOUBLE_EQ(j["traffic"]["routes_per_rank"]["mean"].get<double>(), 4096.0 * 8);
  EXPECT_GT(j["traffic"]["expert_imbalance"].get<double>(), 1.5);
  EXPECT_GT(j["memory_bytes"]["total"].get<int64_t>(), 0);
  EXPECT_TRUE(j["roofline"]["forward"]["bound"] == "compute" || j["roofline"]["forward"]["bound"] == "nvlink");
}

TEST(Cli, PlanFromTraceFile) {
  RoutingSpec spec;
  spec.kind = RoutingKind::kZipf;
  spec.seed = 3;
  const Routing routing = make_routing(spec, 4, 256, 8, 256);
  const std::string path = temp_path("caracal_cli_trace.npy");
  save_routing_npy(routing, path);
  nlohmann::json j;
  ASSERT_NO_FATAL_FAILURE(run_cli_json("plan --model deepseek-v3 --trace " + path + " --json", j));
  EXPECT_EQ(j["world"]["ep"], 4);
  EXPECT_EQ(j["world"]["tokens_per_rank"], 256);
  EXPECT_EQ(j["world"]["routing"], "trace:" + path);
  const RunResult table = run_cli("plan --model deepseek-v3 --trace " + path);
  EXPECT_EQ(table.exit_code, 0) << table.err;
  EXPECT_NE(table.out.find("trace:"), std::string::npos);
  // The same trace through a pipe.
  const RunResult piped = run_cli("plan --model deepseek-v3 --trace /dev/stdin --json", path);
  ASSERT_EQ(piped.exit_code, 0) << piped.err;
  nlohmann::json from_pipe = nlohmann::json::parse(piped.out);
  EXPECT_EQ(from_pipe["world"]["routing"], "trace:/dev/stdin");
  from_pipe["world"]["routing"] = j["world"]["routing"];
  EXPECT_EQ(from_pipe, j);
  std::remove(path.c_str());
}

TEST(Cli, PlanExplicitShape) {
  nlohmann::json j;
  ASSERT_NO_FATAL_FAILURE(
      run_cli_json("plan --hidden 1024 --intermediate 512 --experts 32 --top-k 4 --shared-intermediate 0 --ep 4 "
                   "--tokens 1000 --routing all-to-one:5 --json",
                   j));
  EXPECT_TRUE(j["model"].is_null());
  EXPECT_EQ(j["layer"]["shared_experts"], 0);
  EXPECT_DOUBLE_EQ(j["traffic"]["rank_imbalance"].get<double>(), 4.0);
}

TEST(Cli, ModelsListsEveryPreset) {
  const RunResult r = run_cli("models");
  ASSERT_EQ(r.exit_code, 0);
  for (const char* name : {"deepseek-v3", "kimi-k2", "glm-5", "qwen3.5-397b", "qwen3-235b", "qwen3-30b-a3b",
                           "deepseek-v4-pro", "gpt-oss-120b"})
    EXPECT_NE(r.out.find(name), std::string::npos) << name;
  EXPECT_NE(r.out.find("gpt-oss-120b: plan and bench refuse it: its experts have biases"), std::string::npos) << r.out;
}

TEST(Cli, ModelsJsonGivesEachPresetAndWhetherTheLayerRunsIt) {
  const RunResult r = run_cli("models --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["presets"].size(), 8u) << r.out;
  for (const nlohmann::json& p : j["presets"]) {
    const std::string name = p["name"];
    EXPECT_EQ(p["supported"], name != "gpt-oss-120b") << name;
    EXPECT_EQ(p.contains("unsupported"), name == "gpt-oss-120b") << name;
    if (name == "qwen3-30b-a3b") {
      EXPECT_EQ(p["hidden"], 2048);
      EXPECT_EQ(p["intermediate"], 768);
      EXPECT_EQ(p["experts"], 128);
      EXPECT_EQ(p["top_k"], 8);
      EXPECT_EQ(p["shared_intermediate"], 0);
    }
  }
}

TEST(Cli, PlanQwen3A3bAtEp8) {
  nlohmann::json j;
  ASSERT_NO_FATAL_FAILURE(run_cli_json("plan --model qwen3-30b-a3b --ep 8 --tokens 4096 --json", j));
  EXPECT_EQ(j["model"], "qwen3-30b-a3b");
  EXPECT_EQ(j["world"]["local_experts"], 16);
}

// gpt-oss-120b's experts (biases, clamped SwiGLU) are not the layer's: plan and bench refuse the
// preset, naming why and the options that give its shape alone; those options plan.
TEST(Cli, GptOssPresetIsRefusedNamingWhy) {
  const std::string shape = "--hidden 2880 --intermediate 2880 --experts 128 --top-k 4 --shared-intermediate 0";
  for (const std::string command : {"plan --model gpt-oss-120b --ep 8 --tokens 4096",
                                    "bench --model gpt-oss-120b --experts 16 --ep 1 --tokens 4096"}) {
    expect_clean_error(command, "--model gpt-oss-120b: not supported: its experts have biases");
    expect_clean_error(command, "clamped SwiGLU");
    expect_clean_error(command, "its shape alone, with Caracal's plain SwiGLU: " + shape);
  }
  const RunResult r = run_cli("plan " + shape + " --ep 8 --tokens 4096");
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST(Cli, HelpExitsZero) {
  const RunResult r = run_cli("plan --help");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("--trace"), std::string::npos);
}

TEST(Cli, BadInputGetsOneClearErrorLine) {
  expect_clean_error("plan --model deepseek-v9 --tokens 16", "unknown preset 'deepseek-v9'");
  expect_clean_error("plan --model deepseek-v3 --ep abc --tokens 16", "--ep");
  expect_clean_error("plan --model deepseek-v3 --ep 3 --tokens 16", "divisible");
  expect_clean_error("plan --model deepseek-v3 --ep 8 --tokens -5", "tokens");
  expect_clean_error("plan --model deepseek-v3 --ep 8", "--tokens is required");
  expect_clean_error("plan --model deepseek-v3 --tokens 16 --routing zipf:-1", "zipf");
  expect_clean_error("plan --model deepseek-v3 --tokens 16 --routing pareto", "pareto");
  expect_clean_error("plan --model deepseek-v3 --tokens 16 --tile 128", "tile");
  expect_clean_error("plan --model deepseek-v3 --tokens 16 --precision fp16", "--precision");
  expect_clean_error("plan --hidden 1000 --intermediate 512 --experts 8 --top-k 2 --tokens 8", "hidden");
  expect_clean_error("plan --intermediate 512 --experts 8 --top-k 2 --tokens 8", "--hidden");
  expect_clean_error("plan --model deepseek-v3 --tokens 16 --no-such-flag", "no-such-flag");
  expect_clean_error("", "subcommand");
}

// Sizes past their bounds: one line naming the argument, the bound and the value, whatever it is
// (no overflow on the way: build-ubsan runs these).
TEST(Cli, SizesPastTheirBoundsGetOneClearErrorLine) {
  const std::string huge = "4611686018427387904";  // 2^62, a multiple of 64 and of 128
  const std::string shape = " --experts 8 --top-k 2 --tokens 8";
  expect_clean_error("plan --hidden 2147483647 --intermediate 512" + shape, "hidden must be in [1, 65536], got 2147483647");
  expect_clean_error("plan --hidden " + huge + " --intermediate 512" + shape, "hidden must be in [1, 65536], got " + huge);
  expect_clean_error("plan --hidden 1024 --intermediate " + huge + shape, "intermediate must be in [1, 65536], got " + huge);
  expect_clean_error("plan --hidden 1024 --intermediate 512 --shared-intermediate " + huge + shape,
                     "shared_intermediate must be in [1, 65536], got " + huge);
  expect_clean_error("plan --hidden 1024 --intermediate 512 --experts " + huge + " --top-k 2 --tokens 8",
                     "num_experts must be in [1, 65536], got " + huge);
  expect_clean_error("plan --model deepseek-v3 --tokens 16 --sms " + huge, "sms must be in [1, 1024], got " + huge);
  expect_clean_error("plan --model deepseek-v3 --tokens 16 --tile 128x" + huge, "tile must be at most 1024x1024");
  expect_clean_error("plan --hidden 1024 --intermediate 512" + shape + " --ring-rows 9223372036854775807",
                     "ring_rows must be in [0, 2147483647] (0: automatic), got 9223372036854775807");
  // A multiple of this shape's minibatch (8,448 rows) past 2^31.
  expect_clean_error("plan --hidden 1024 --intermediate 512" + shape + " --ring-rows 9288674231451648",
                     "ring_rows must be in [0, 2147483647] (0: automatic), got 9288674231451648");
}

TEST(Cli, BadTraceFilesGetOneClearErrorLine) {
  const std::string missing = temp_path("caracal_no_such_trace.npy");
  expect_clean_error("plan --model deepseek-v3 --trace " + missing, missing);

  const std::string not_npy = temp_path("caracal_not_npy.npy");
  std::ofstream(not_npy) << "hello, this is not a numpy file\n";
  expect_clean_error("plan --model deepseek-v3 --trace " + not_npy, not_npy);

  // A valid trace whose top-k (4) differs from the model's (8).
  RoutingSpec spec;
  const std::string wrong_k = temp_path("caracal_wrong_k.npy");
  save_routing_npy(make_routing(spec, 2, 16, 4, 256), wrong_k);
  expect_clean_error("plan --model deepseek-v3 --trace " + wrong_k, "top-k");
  // ... or whose W disagrees with an explicit --ep.
  expect_clean_error("plan --model deepseek-v3 --top-k 4 --ep 8 --trace " + wrong_k, "--ep 8");

  // int64 data instead of int32: hand-written .npy v1.0 header.
  const std::string wrong_dtype = temp_path("caracal_wrong_dtype.npy");
  {
    std::string header = "{'descr': '<i8', 'fortran_order': False, 'shape': (1, 2, 1), }";
    while ((10 + header.size() + 1) % 64 != 0) header += ' ';
    header += '\n';
    std::ofstream f(wrong_dtype, std::ios::binary);
    f.write("\x93NUMPY\x01\x00", 8);
    const uint16_t len = static_cast<uint16_t>(header.size());
    f.write(reinterpret_cast<const char*>(&len), 2);
    f << header;
    const int64_t data[2] = {0, 1};
    f.write(reinterpret_cast<const char*>(data), sizeof data);
  }
  expect_clean_error("plan --model deepseek-v3 --top-k 1 --trace " + wrong_dtype, "<i8");
  for (const std::string& p : {not_npy, wrong_k, wrong_dtype}) std::remove(p.c_str());
}

// `caracal bench` (tools/caracal_bench, exec'd by `caracal`): its argument errors come before it
// touches the GPU, so they read the same on every machine.
TEST(Cli, BenchBadInputGetsOneClearErrorLine) {
  expect_clean_error("bench --model qwen3-30b-a3b --hidden 2880 --precision fp8", "multiple of 128 for fp8");
  expect_clean_error("bench --model deepseek-v3 --precision fp8 --profile-step --profile-path v1", "--profile-path");
  expect_clean_error("bench --model deepseek-v3 --precision fp16", "--precision");
  expect_clean_error("bench --model deepseek-v9", "unknown preset 'deepseek-v9'");
  expect_clean_error("bench --model deepseek-v3 --ep 3", "divisible");
  expect_clean_error("bench --model deepseek-v3 --ep abc", "--ep");
  expect_clean_error("bench --model deepseek-v3 --tokens 0", "--tokens");
  expect_clean_error("bench --model deepseek-v3 --sweep 64,0", "--sweep");
  expect_clean_error("bench --model deepseek-v3 --routing pareto", "pareto");
  expect_clean_error("bench --model deepseek-v3 --routing all-to-one:999", "all-to-one");
  expect_clean_error("bench --model deepseek-v3 --backend mpi", "--backend");
  expect_clean_error("bench --model deepseek-v3 --reps 0", "--reps");
  expect_clean_error("bench --model deepseek-v3 --rounds 0", "--rounds");
  expect_clean_error("bench --intermediate 512 --experts 8 --top-k 2", "--hidden");
  expect_clean_error("bench --model deepseek-v3 --no-such-flag", "no-such-flag");
  // The timed layer's options are checked with the configuration (layer_options.hpp).
  expect_clean_error("bench --model deepseek-v3 --ring-rows 100", "ring_rows must be 0 (default) or a positive multiple of 128");
}

TEST(Cli, BenchHelpExitsZero) {
  const RunResult r = run_cli("bench --help");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  for (const char* option : {"--model", "--ep", "--backend", "--tokens", "--sweep", "--routing", "--precision",
                             "--warmup", "--reps", "--rounds", "--json", "--no-validate", "--quiet"}) {
    EXPECT_NE(r.out.find(option), std::string::npos) << option;
  }
}

// Without a GPU (or CUDA driver) a valid bench command fails with one clear line, and plan still works.
TEST(Cli, BenchWithoutGpuGetsOneClearErrorLine) {
  if (access("/dev/nvidiactl", F_OK) == 0 || access("/dev/nvidia0", F_OK) == 0) {
    GTEST_SKIP() << "an NVIDIA device is present (the GPU smoke test runs the bench)";
  }
  expect_clean_error("bench --model deepseek-v3 --experts 32 --tokens 64", "no GPU");
  EXPECT_EQ(run_cli("plan --model deepseek-v3 --tokens 64").exit_code, 0);
}

// caracal-soak: every argument error is one line naming the option and what it takes, exit status 1,
// before anything touches a GPU.
TEST(Cli, SoakBadInputGetsOneClearErrorLine) {
  const auto soak_error = [](const std::string& args, const std::string& what) {
    expect_clean_error_of(soak_path(), args, what);
    EXPECT_EQ(run_program(soak_path(), args).exit_code, 1) << args;
  };
  soak_error("--ep 0", "--ep must be at least 1, got 0");
  soak_error("--ep abc", "--ep");
  soak_error("--steps 0", "--steps must be at least 1, got 0");
  soak_error("--backend mpi", "--backend");
  soak_error("--hidden 1000", "hidden must be a multiple of 64");
  soak_error("--experts-per-rank 0", "--experts-per-rank must be at least 1, got 0");
  soak_error("--reference-every -1", "--reference-every must be 0 (off) or a step count, got -1");
  soak_error("--reference-every x", "--reference-every");
  soak_error("--path fast", "--path: fast not in {fused,v1,both}");
  soak_error("--graph --steps 2", "--graph needs --steps >= 3");
  soak_error("--stall-at 3 --backend nccl --ep 2", "--stall-at needs --backend loopback");
  soak_error("--stall-at 3 --ep 1", "--stall-at needs --ep >= 2");
  soak_error("--stall-at 10 --steps 10", "--stall-at must be a step of the run from 2");
  soak_error("--stall-at 1 --steps 10", "to 9 (--steps 10), got 1");
  soak_error("--stall-at -2", "--stall-at must be a step of the run from 2");
  soak_error("--no-such-flag", "no-such-flag");
}

TEST(Cli, SoakHelpNamesTheChecks) {
  const RunResult r = run_program(soak_path(), "--help");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  for (const char* option : {"--reference-every", "--graph", "--path", "--stall-at", "--checksums", "--json"}) {
    EXPECT_NE(r.out.find(option), std::string::npos) << option;
  }
}

// Without a GPU (or CUDA driver) valid soak options fail with one clear line, exit status 2.
TEST(Cli, SoakWithoutGpuGetsOneClearErrorLine) {
  if (access("/dev/nvidiactl", F_OK) == 0 || access("/dev/nvidia0", F_OK) == 0) {
    GTEST_SKIP() << "an NVIDIA device is present (test_gpu_soak_smoke runs the soak)";
  }
  expect_clean_error_of(soak_path(), "--steps 3 --graph --path both --stall-at 2", "no GPU");
  EXPECT_EQ(run_program(soak_path(), "--steps 3").exit_code, 2);
}

}  // namespace
}  // namespace caracal
