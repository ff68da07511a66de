// `caracal bench` end to end on a tiny shape: validation against the fp64 reference, timing, the
// baselines and --json (the binary is caracal-bench, which `caracal bench` execs). The validation
// must have run the timed layers with their timed options (--json's "layer_options"), on the timed
// backend, W, weight-gradient precision and graphs, each output within its bound.
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
#include "gpu/tool_path.hpp"

namespace {

std::string bench_path() { return caracal::test::tool_path("CARACAL_BENCH", "caracal-bench", CARACAL_BENCH_PATH); }

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

// Every output of a validated layer within its bound: each measure a number at most its bound.
void expect_outputs_within_bounds(const nlohmann::json& layer) {
  const std::string name = layer.at("layer").get<std::string>();
  EXPECT_TRUE(layer.at("passed").get<bool>()) << name;
  const nlohmann::json& outputs = layer.at("outputs");
  EXPECT_GE(outputs.size(), 6u) << name;  // y, dx, d_topk_scores, d_w_gate, d_w_up, d_w_down (+ the shared expert's)
  for (const nlohmann::json& o : outputs) {
    SCOPED_TRACE(name + " " + o.at("output").get<std::string>());
    EXPECT_TRUE(o.at("passed").get<bool>()) << o.dump();
    ASSERT_FALSE(o.at("error").empty()) << o.dump();
    for (const auto& [measure, error] : o.at("error").items()) {
      ASSERT_TRUE(error.is_number()) << measure << ": " << o.dump();
      EXPECT_GE(error.get<double>(), 0.0) << measure;
      EXPECT_LE(error.get<double>(), o.at("bound").at(measure).get<double>()) << measure;
    }
  }
}

// The validation ran the layers the bench timed: the fused one and v1 with the options --json
// gives for the timed ones (the fused layer's ring aside where it says it scaled it), on the timed
// backend, W, weight-gradient precision and graphs; each output within its bound; and it says what
// it did not validate. `scaled`: the fused layer's ring is scaled, else the timed option.
void expect_validated(const BenchRun& r, bool scaled = false) {
  const nlohmann::json& v = r.json.at("validation");
  ASSERT_TRUE(v.at("ran").get<bool>()) << v.dump(2);
  EXPECT_TRUE(v.at("passed").get<bool>()) << v.dump(2);
  EXPECT_EQ(v.at("backend"), r.json.at("backend"));
  EXPECT_EQ(v.at("ep"), r.json.at("ep"));
  EXPECT_EQ(v.at("weight_grads"), r.json.at("weight_grads"));
  EXPECT_EQ(v.at("graph"), r.json.at("graph"));
  EXPECT_EQ(v.at("config").at("hidden").get<int64_t>(), 256);
  EXPECT_EQ(v.at("config").at("tokens_per_rank").get<int64_t>(), 37);
  std::vector<std::string> names;
  for (const nlohmann::json& layer : v.at("layers")) {
    const std::string name = layer.at("layer").get<std::string>();
    SCOPED_TRACE("validated layer " + name);
    names.push_back(name);
    const nlohmann::json& timed = r.json.at("layer_options").at(name);
    EXPECT_EQ(layer.at("timed_options"), timed);
    nlohmann::json options = layer.at("options"), timed_but_ring = timed;
    if (name == "fused") {
      const nlohmann::json& ring = layer.at("ring");
      const std::string how = ring.at("how").get<std::string>();
      EXPECT_EQ(options.at("ring_rows"), ring.at("option"));
      if (scaled) {
        EXPECT_EQ(how, "scaled") << ring.dump();
      } else {
        EXPECT_TRUE(how == "the timed ring" || how == "the default ring, as timed") << ring.dump();
        EXPECT_EQ(options.at("ring_rows"), timed.at("ring_rows"));
      }
      EXPECT_GT(ring.at("rows").get<int64_t>(), 0);
      EXPECT_GE(ring.at("macrobatches").get<int64_t>(), 1);
      for (const nlohmann::json& t : ring.at("timed")) {  // as many macrobatches, or as many as the small step has
        EXPECT_GE(t.at("macrobatches").get<int64_t>(), 1);
        if (ring.at("macrobatches").get<int64_t>() < t.at("macrobatches").get<int64_t>()) {
          EXPECT_NE(v.at("not_validated").dump().find("macrobatches"), std::string::npos) << v.dump(2);
        }
      }
      options.erase("ring_rows");
      timed_but_ring.erase("ring_rows");
    }
    EXPECT_EQ(options, timed_but_ring);
    expect_outputs_within_bounds(layer);
  }
  EXPECT_EQ(names, (std::vector<std::string>{"fused", "v1"}));
  ASSERT_FALSE(v.at("not_validated").empty());
  EXPECT_NE(v.at("not_validated")[0].get<std::string>().find("the timed size"), std::string::npos);
  EXPECT_NE(r.out.find("check   fp64 reference"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("not validated: the timed size"), std::string::npos) << r.out;
}

void expect_report(const BenchRun& r, int64_t tokens, int64_t ep, bool nccl_baseline) {
  ASSERT_EQ(r.exit_code, 0) << r.out;
  ASSERT_TRUE(r.json.is_object()) << "no JSON; output:\n" << r.out;
  EXPECT_EQ(r.json.at("ep").get<int64_t>(), ep);
  expect_validated(r);
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

// The validation of a run with a ring, bf16 weight gradients and graphs validates exactly that:
// the ring of 128 rows (several macrobatches of the small step), bf16 gradients against the bound
// widened by their rounding, through graph replays; and says the graphs of the forward and of the
// backward alone were not validated apart.
TEST(BenchSmoke, ValidatesTheRingBf16GradientsAndGraphsItTimes) {
  CARACAL_REQUIRE_GPU();
  const BenchRun r =
      run_bench(std::string(kTinyShape) + " --ep 2 --tokens 256 --ring-rows 128 --bf16-weight-grads --graph");
  expect_report(r, 256, 2, false);
  const nlohmann::json& v = r.json.at("validation");
  EXPECT_EQ(v.at("weight_grads").get<std::string>(), "bf16");
  EXPECT_TRUE(v.at("graph").get<bool>());
  const nlohmann::json& fused = v.at("layers")[0];
  EXPECT_EQ(fused.at("options").at("ring_rows").get<int>(), 128);
  EXPECT_TRUE(fused.at("options").at("bf16_weight_gradients").get<bool>());
  EXPECT_EQ(fused.at("ring").at("rows").get<int64_t>(), 128);
  EXPECT_GE(fused.at("ring").at("macrobatches").get<int64_t>(), 2);
  for (const nlohmann::json& o : fused.at("outputs")) {  // the bf16 bound: the fp32 one + 2^-8 and a little
    if (o.at("output").get<std::string>() == "d_w_gate") {
      EXPECT_GT(o.at("bound").at("row").get<double>(), 1.0 / 256);
    }
  }
  EXPECT_NE(v.at("not_validated").dump().find("graphs"), std::string::npos) << v.dump(2);
  EXPECT_NE(r.out.find("through CUDA graph replays: passed"), std::string::npos) << r.out;
}

// A ring that holds the small step in one macrobatch but the timed step in several: the validation
// scales it to give the small step several too, and says so.
TEST(BenchSmoke, ScalesTheTimedRingToTheValidatedStep) {
  CARACAL_REQUIRE_GPU();
  const BenchRun r = run_bench(std::string(kTinyShape) + " --ep 1 --tokens 1024 --ring-rows 1024");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  ASSERT_TRUE(r.json.is_object()) << r.out;
  expect_validated(r, /*scaled=*/true);
  const nlohmann::json& ring = r.json.at("validation").at("layers")[0].at("ring");
  EXPECT_GE(ring.at("timed")[0].at("macrobatches").get<int64_t>(), 2) << ring.dump();
  EXPECT_GE(ring.at("macrobatches").get<int64_t>(), 2) << ring.dump();
  EXPECT_LT(ring.at("option").get<int>(), 1024) << ring.dump();
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

// --precision fp8: the FP8 layer validated against the unquantized layer's reference within the FP8
// bounds (beside the bf16 fused layer and v1 within theirs), then timed beside the bf16 fused layer
// and bf16 v1; the GEMMs-alone ratios are the bf16 fused layer's.
TEST(BenchSmoke, Fp8TimesTheFp8LayerBesideBf16) {
  CARACAL_REQUIRE_GPU();
  const BenchRun r = run_bench(std::string(kTinyShape) + " --ep 1 --tokens 256 --precision fp8");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  ASSERT_TRUE(r.json.is_object()) << r.out;
  EXPECT_EQ(r.json.at("precision").get<std::string>(), "fp8");
  const nlohmann::json& v = r.json.at("validation");
  EXPECT_TRUE(v.at("passed").get<bool>()) << v.dump(2);
  std::vector<std::string> names;
  for (const nlohmann::json& layer : v.at("layers")) {
    const std::string name = layer.at("layer").get<std::string>();
    names.push_back(name);
    expect_outputs_within_bounds(layer);
    EXPECT_EQ(layer.at("precision").get<std::string>(), name == "fp8" ? "fp8" : "bf16");
    const double y_bound = layer.at("outputs")[0].at("bound").at("frobenius").get<double>();
    EXPECT_EQ(layer.at("outputs")[0].at("output").get<std::string>(), "y");
    if (name == "fp8") {
      EXPECT_GT(y_bound, 0.1) << "the FP8 layer is held to the FP8 bounds";
    } else {
      EXPECT_LT(y_bound, 0.01) << name << " is held to the bf16 bounds";
    }
  }
  EXPECT_EQ(names, (std::vector<std::string>{"fp8", "fused", "v1"}));
  const nlohmann::json& run = r.json.at("runs").at(0);
  EXPECT_EQ(run.at("forward_path").get<std::string>(), "fp8 (v1's launches)");
  EXPECT_GT(run.at("fp8_weight_quantization_ms").get<double>(), 0.0);
  EXPECT_GT(run.at("fp8_fwd_bwd_weights_ready_ms").get<double>(), 0.0);
  for (const char* pass : {"forward", "backward", "fwd_bwd"}) {
    expect_pass(run.at(pass), pass);
    expect_pass(run.at("bf16_fused").at(pass), "bf16 fused");
    expect_pass(run.at("v1").at(pass), "v1");
  }
  const nlohmann::json& nccl = run.at("baselines").at("nccl_exchange_plus_gemms");
  EXPECT_DOUBLE_EQ(nccl.at("forward_over_gemms_alone").get<double>(),
                   run.at("bf16_fused").at("forward").at("ms").get<double>() /
                       nccl.at("gemms_alone_forward_ms").get<double>());
  EXPECT_NE(r.out.find("fp8 over bf16 (fused): forward"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("fp8 fwd+bwd on weights quantized before"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("fp8 over bf16 v1"), std::string::npos) << r.out;
}

TEST(BenchSmoke, ProfileStepRunsOneStepWithoutTiming) {
  CARACAL_REQUIRE_GPU();
  const BenchRun r = run_bench(std::string(kTinyShape) + " --ep 2 --tokens 256 --no-validate --profile-step");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("profiled T=256: one forward and backward"), std::string::npos) << r.out;
  EXPECT_TRUE(r.json.at("profiled").get<bool>());
  EXPECT_FALSE(r.json.contains("runs"));
}

// The FP8 layer's profiled step: its weights quantized into blocks of their own first, as a timed step.
TEST(BenchSmoke, ProfileStepRunsTheFp8LayersStep) {
  CARACAL_REQUIRE_GPU();
  const BenchRun r =
      run_bench(std::string(kTinyShape) + " --ep 1 --tokens 256 --no-validate --profile-step --precision fp8");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("profiled T=256: one forward and backward"), std::string::npos) << r.out;
  EXPECT_TRUE(r.json.at("profiled").get<bool>());
}

TEST(BenchSmoke, NcclOneRank) {
  CARACAL_REQUIRE_GPU();
  expect_report(run_bench(std::string(kTinyShape) + " --ep 1 --backend nccl --tokens 128"), 128, 1, true);
}

// W = 2 over NCCL, one GPU per rank: the validation runs on that backend too.
TEST(BenchSmoke, NcclTwoRanksValidatesOnNccl) {
  CARACAL_REQUIRE_GPUS(2);
  const BenchRun r = run_bench(std::string(kTinyShape) + " --ep 2 --backend nccl --tokens 128");
  expect_report(r, 128, 2, false);
  EXPECT_EQ(r.json.at("validation").at("backend").get<std::string>(), "nccl");
}

TEST(BenchSmoke, SweepWritesOneRunPerTokenCount) {
  CARACAL_REQUIRE_GPU();
  const BenchRun r = run_bench(std::string(kTinyShape) + " --ep 2 --sweep 64,128 --no-validate");
  ASSERT_EQ(r.exit_code, 0) << r.out;
  ASSERT_TRUE(r.json.is_object()) << r.out;
  EXPECT_FALSE(r.json.at("validation").at("ran").get<bool>());
  EXPECT_FALSE(r.json.at("validation").at("passed").get<bool>());
  EXPECT_NE(r.out.find("check   not validated (--no-validate)"), std::string::npos) << r.out;
  ASSERT_EQ(r.json.at("runs").size(), 2u);
  EXPECT_EQ(r.json.at("runs")[1].at("tokens_per_rank").get<int64_t>(), 128);
}

}  // namespace
