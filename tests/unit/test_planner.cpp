#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "caracal/error.hpp"
#include "caracal/plan.hpp"
#include "caracal/presets.hpp"
#include "caracal/routing.hpp"

namespace caracal {
namespace {

// A layer of `shape` (the default router) at EP `ep` with `tokens` per rank.
LayerConfig config_of(const LayerShape& shape, int64_t ep, int64_t tokens) {
  LayerConfig c;
  c.shape = shape;
  c.ep_size = ep;
  c.tokens_per_rank = tokens;
  return c;
}

LayerConfig config_for(const std::string& model, int64_t ep, int64_t tokens) {
  const ModelPreset& p = find_model_preset(model);
  LayerConfig c = config_of(p.shape, ep, tokens);
  c.router = p.router;
  return c;
}

Plan plan_with(const LayerConfig& c, RoutingKind kind, PlanOptions options = {}) {
  RoutingSpec spec;
  spec.kind = kind;
  spec.seed = 7;
  const Routing r = make_routing(spec, c.ep_size, c.tokens_per_rank, c.shape.top_k, c.shape.num_experts);
  return make_plan(c, r, to_string(spec), options);
}

TEST(Planner, OverlapRuleMatchesDesignKimiFigure) {
  // DESIGN §2: H200, 132 SMs, 128x256 tiles, Kimi K2 shapes -> 2,112 rows.
  const Plan p = plan_with(config_for("kimi-k2", 8, 512), RoutingKind::kUniform);
  EXPECT_EQ(p.overlap_min_rows, 2112);
  EXPECT_EQ(p.minibatch_rows, 2176);  // rounded up to the 128-row tile
  EXPECT_EQ(p.ring_rows % p.minibatch_rows, 0);
  // The layer sizes its ring by the same rule (MoELayerOptions::ring_rows = 0).
  EXPECT_EQ(p.ring_rows, default_ring_rows(config_for("kimi-k2", 8, 512)));
  // 512 * 8 routes + 48 experts * 127 rows of padding = 10,192 -> 5 minibatches.
  EXPECT_EQ(p.ring_rows, 5 * 2176);
}

TEST(Planner, BalancedStepFitsOneMacrobatch) {
  const LayerConfig c = config_for("deepseek-v3", 8, 4096);
  const Plan p = plan_with(c, RoutingKind::kUniform);
  EXPECT_DOUBLE_EQ(p.routes_per_rank.mean, 4096.0 * 8);  // every route lands somewhere
  EXPECT_DOUBLE_EQ(p.routes_per_expert.mean, 4096.0 * 8 * 8 / 256);
  EXPECT_LT(p.rank_imbalance, 1.1);
  EXPECT_GE(p.padded_rows_max, static_cast<int64_t>(p.routes_per_rank.max));
  EXPECT_EQ(p.padded_rows_max % 128, 0);
  EXPECT_EQ(p.macrobatches, 1);
  EXPECT_EQ(p.replayed_rows, 0);
  EXPECT_EQ(p.empty_slots, 0);
  EXPECT_STREQ(p.roofline.forward_bound(), "compute");
  // A token's 8 routes reach about 5.3 of the 8 ranks: one row per (token, rank) moves ~1.5x
  // fewer bytes than one row per route (v1).
  const double saving = static_cast<double>(p.roofline.v1_forward_nvlink_bytes) /
                        static_cast<double>(p.roofline.forward_nvlink_bytes);
  EXPECT_GT(saving, 1.4);
  EXPECT_LT(saving, 1.65);
  // Today's kernels move a row per (token, rank) both ways, as designed (the backward's dx summed
  // per (token, rank) before it goes home): fewer bytes than v1's row per route.
  EXPECT_EQ(p.roofline.forward_nvlink_bytes, p.roofline.today_forward_nvlink_bytes);
  EXPECT_EQ(p.roofline.backward_nvlink_bytes, p.roofline.today_backward_nvlink_bytes);
  EXPECT_LT(p.roofline.today_backward_nvlink_bytes, p.roofline.v1_backward_nvlink_bytes);
}

TEST(Planner, AllToOneNeedsSeveralMacrobatchesAndReplays) {
  const LayerConfig c = config_for("deepseek-v3", 8, 4096);
  const Plan p = plan_with(c, RoutingKind::kAllToOne);
  const int64_t all_routes = 8 * 4096 * 8;
  EXPECT_EQ(p.routes_per_rank.max, all_routes);
  EXPECT_EQ(p.routes_per_rank.min, 0);
  EXPECT_DOUBLE_EQ(p.rank_imbalance, 8.0);
  EXPECT_EQ(p.padded_rows_max, all_routes);  // a multiple of 128 already
  EXPECT_EQ(p.empty_experts, 255);
  EXPECT_EQ(p.macrobatches, (all_routes + p.ring_rows - 1) / p.ring_rows);
  EXPECT_EQ(p.replayed_rows, all_routes - p.ring_rows);
  // The busiest rank pulls each token of the 7 other ranks once (its 8 routes share one token
  // row); v1 pulls 7/8 of all routes.
  EXPECT_EQ(p.roofline.forward_nvlink_bytes, int64_t{7} * 4096 * (7168 * 2));
  EXPECT_EQ(p.roofline.v1_forward_nvlink_bytes, int64_t{7} * 4096 * 8 * (7168 * 2));
  // Today's kernels push one sum per token home as well (combine per (token, rank)).
  EXPECT_EQ(p.roofline.today_forward_nvlink_bytes, p.roofline.forward_nvlink_bytes);
}

TEST(Planner, PullsReadATokenOncePerMacrobatchItsRowsFallIn) {
  // At EP 2 a token's ~4 rows on the other rank lie in different experts' segments: a ring of one
  // minibatch cuts many of them apart, and each part is read once.
  const LayerConfig c = config_for("deepseek-v3", 2, 4096);
  const Plan whole = plan_with(c, RoutingKind::kUniform);
  PlanOptions small;
  small.ring_rows = whole.minibatch_rows;
  const Plan cut = plan_with(c, RoutingKind::kUniform, small);
  EXPECT_EQ(whole.macrobatches, 1);
  EXPECT_GT(cut.macrobatches, 10);
  EXPECT_GT(cut.roofline.today_forward_nvlink_bytes, whole.roofline.today_forward_nvlink_bytes);
  EXPECT_LT(cut.roofline.today_forward_nvlink_bytes, cut.roofline.v1_forward_nvlink_bytes);
  EXPECT_EQ(cut.roofline.v1_forward_nvlink_bytes, whole.roofline.v1_forward_nvlink_bytes);
}

TEST(Planner, SharedExpertNeedsNoCopiesWhenTheTokensFillItsTiles) {
  LayerConfig c;
  c.shape = LayerShape{64, 128, 4, 2, 1, 64};
  c.ep_size = 2;
  PlanOptions o;
  o.tile_m = 16;
  o.tile_n = 16;
  o.sm_count = 2;
  const int64_t D = 64, Is = 64;
  // T = 16 fills its tile: the shared expert reads x and dy and writes its output and dx in the
  // exchange's buffers (LayerSizes::shared_rows_in_place); T = 17 pads to 32 rows of its own.
  c.tokens_per_rank = 16;
  const Plan filled = plan_with(c, RoutingKind::kUniform, o);
  EXPECT_EQ(filled.memory.saved, 16 * 3 * Is * 2 + 16 * 2 * 4 + 16 * 4);
  c.tokens_per_rank = 17;
  const Plan padded = plan_with(c, RoutingKind::kUniform, o);
  EXPECT_EQ(padded.memory.saved, 32 * (3 * D + 3 * Is) * 2 + 32 * 2 * 4 + 32 * 4);
}

TEST(Planner, SingleRankMovesNothingOverNvlink) {
  const LayerConfig c = config_for("deepseek-v3", 1, 1000);
  const Plan p = plan_with(c, RoutingKind::kZipf);
  EXPECT_EQ(p.roofline.forward_nvlink_bytes, 0);
  EXPECT_EQ(p.roofline.backward_nvlink_bytes, 0);
  EXPECT_EQ(p.roofline.v1_forward_nvlink_bytes, 0);
  EXPECT_EQ(p.roofline.today_forward_nvlink_bytes, 0);
  EXPECT_EQ(p.roofline.today_backward_nvlink_bytes, 0);
  EXPECT_STREQ(p.roofline.forward_bound(), "compute");
  // Compute counts padded rows and the shared expert.
  const double D = 7168, I = 2048, T = 1000;
  const double expected = 6.0 * static_cast<double>(p.padded_rows_max) * D * I + 6.0 * T * D * I;
  EXPECT_DOUBLE_EQ(p.roofline.forward_flops, expected);
  EXPECT_DOUBLE_EQ(p.roofline.forward_compute_ms, expected / (806.0 * 1e9));
  EXPECT_DOUBLE_EQ(p.roofline.backward_flops, 2 * expected);  // nothing replayed
}

// The plan's default matrix rate is its precision's (dense cuBLAS on an H200): FP8 1,135, bf16 806.
TEST(Planner, DefaultRateIsThePrecisions) {
  EXPECT_DOUBLE_EQ(default_plan_tflops(Precision::kBF16), 806.0);
  EXPECT_DOUBLE_EQ(default_plan_tflops(Precision::kFP8), 1135.0);
  EXPECT_DOUBLE_EQ(PlanOptions{}.tflops, default_plan_tflops(Precision::kBF16));
}

TEST(Planner, MemoryOfATinyLayerByHand) {
  const LayerConfig c = config_of(LayerShape{64, 128, 4, 2, 1, 64}, 2, 10);
  PlanOptions o;
  o.tile_m = 16;
  o.tile_n = 16;
  o.sm_count = 2;
  const Plan p = plan_with(c, RoutingKind::kUniform, o);
  const int64_t T = 10, k = 2, D = 64, I = 128, L = 2, W = 2, Is = 64;
  // Per token and route: x, y, dy, dx, the shared expert's out and dx; the slots; topk_idx,
  // scores, gates, score gradients, dg slots.
  EXPECT_EQ(p.memory.symmetric, 6 * T * D * 2 + T * k * D * 2 + 5 * T * k * 4);
  const int64_t capacity = W * T * k + L * (16 - 1);
  const int64_t rows = capacity / 16 * 16;
  const int64_t ring = std::min<int64_t>(p.ring_rows, rows);
  // x, dy and (W > 1: the fused backward's groups) dx rows; gate_up and activation rows.
  EXPECT_EQ(p.memory.ring, ring * (3 * D * 2 + 2 * I * 2 + I * 2));
  // The builder's workspaces: one chunk and one block of counts per source (20 routes).
  const int64_t schedule_heap = capacity * 8 + (2 * L + 2 + L * W) * 4 + T * k * 8 + W * T * k * 4 +
                                W * (1 + 1) * L * 4 + 2 * capacity * 4;
  // One router-gradient partial per row (I <= 256).
  EXPECT_EQ(p.memory.schedule, schedule_heap + rows * 1 * 4);
  const int64_t shared_rows = 16;                               // T rounded up to the tile
  EXPECT_EQ(p.memory.saved, shared_rows * (3 * D + 3 * Is) * 2 + shared_rows * 2 * 4 + shared_rows * 4);
  EXPECT_EQ(p.memory.partials, ring < rows ? 2 * 3 * D * I * 4 : 0);
  EXPECT_EQ(p.memory.weights, L * 3 * D * I * 2 + 3 * D * Is * 2);
  EXPECT_EQ(p.memory.layer_heap + p.memory.layer_local, p.memory.total() - p.memory.weights);
  EXPECT_EQ(p.memory.layer_heap, p.memory.symmetric + ring * 3 * D * 2 + schedule_heap);
  // v1: expert_x, expert_dy and expert_out rows for every route of both ranks (the capacity), gate_up
  // and hidden for every routed row.
  EXPECT_EQ(p.memory.v1_layer_heap - p.memory.layer_heap, 3 * capacity * D * 2 - 3 * ring * D * 2);
  EXPECT_EQ(p.memory.v1_layer_local - p.memory.layer_local, (rows - ring) * 3 * I * 2 - p.memory.partials);
}

// Only an FP8 layer's fused forward reads a task table (src/fused/forward_task_table.cuh): 32 bytes a
// task, every row block's up/gate tiles (2I / 256), down tiles (D / 256) and group sums.
TEST(Planner, OnlyTheFp8PlanHoldsTheForwardTaskTable) {
  const LayerConfig bf16 = config_for("deepseek-v3", 8, 4096);
  LayerConfig fp8 = bf16;
  fp8.precision = Precision::kFP8;
  const Plan b = plan_with(bf16, RoutingKind::kUniform), f = plan_with(fp8, RoutingKind::kUniform);
  const int64_t blocks = (8 * 4096 * 8 + 32 * 127) / 128;  // every route here, L = 32 experts padded
  const int64_t table = blocks * (2 * 2048 / 256 + 7168 / 256 + 1) * 32;
  EXPECT_EQ(f.memory.schedule - b.memory.schedule, table);
}

TEST(Planner, TraceAndGeneratedRoutingGiveTheSamePlan) {
  const LayerConfig c = config_for("qwen3.5-397b", 4, 333);
  RoutingSpec spec;
  spec.kind = RoutingKind::kZipf;
  spec.zipf_exponent = 1.3;
  spec.empty_slot_fraction = 0.1;
  spec.seed = 11;
  const Routing r = make_routing(spec, 4, 333, c.shape.top_k, c.shape.num_experts);
  const std::string path = ::testing::TempDir() + "/caracal_planner_trace.npy";
  save_routing_npy(r, path);
  const Plan from_trace = make_plan(c, load_routing_npy(path), "trace", {});
  const Plan generated = make_plan(c, r, "generated", {});
  std::remove(path.c_str());
  EXPECT_EQ(from_trace.padded_rows_max, generated.padded_rows_max);
  EXPECT_EQ(from_trace.empty_slots, generated.empty_slots);
  EXPECT_GT(generated.empty_slots, 0);
  EXPECT_DOUBLE_EQ(from_trace.roofline.forward_flops, generated.roofline.forward_flops);
  EXPECT_EQ(from_trace.roofline.backward_nvlink_bytes, generated.roofline.backward_nvlink_bytes);
}

TEST(Planner, RejectsRoutingThatDoesNotMatchTheConfig) {
  const LayerConfig c = config_for("deepseek-v3", 8, 64);
  RoutingSpec spec;
  const Routing r = make_routing(spec, 4, 64, 8, 256);
  EXPECT_THROW(make_plan(c, r, "x", {}), Error);
}

TEST(Planner, RejectsRingThatIsNotAMinibatchMultiple) {
  PlanOptions o;
  o.ring_rows = 1000;
  try {
    plan_with(config_for("kimi-k2", 8, 256), RoutingKind::kUniform, o);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ring_rows must be a multiple of the minibatch (2176"),
              std::string::npos)
        << e.what();
  }
}

TEST(Planner, ExplicitRingChangesReplayCount) {
  PlanOptions o;
  o.ring_rows = 2176;
  const Plan p = plan_with(config_for("kimi-k2", 8, 4096), RoutingKind::kUniform, o);
  EXPECT_EQ(p.ring_rows, 2176);
  EXPECT_GT(p.macrobatches, 1);
  EXPECT_EQ(p.replayed_rows, p.padded_rows_max - 2176);
  EXPECT_GT(p.roofline.backward_flops, 2 * p.roofline.forward_flops);
}

// Every size is bounded (LayerConfig::validate, PlanOptions::validate) so that no byte, row or
// FLOP count overflows: at the bounds the plan's sums are exact (build-ubsan checks the arithmetic).
TEST(Planner, PlansAtTheBoundsWithoutOverflow) {
  LayerConfig c = config_of(LayerShape{65536, 65536, 65536, 8, 1, 65536}, 8, 256);
  PlanOptions o;
  o.sm_count = 1024;
  o.tile_n = 1024;
  Plan p = plan_with(c, RoutingKind::kUniform, o);
  const int64_t D = 65536, I = 65536, L = 8192;
  EXPECT_EQ(p.memory.weights, L * 3 * I * D * 2 + 3 * I * D * 2);
  EXPECT_EQ(p.memory.partials, 2 * 3 * D * I * 4);  // the ring is shorter than the worst case's rows
  EXPECT_GT(p.memory.total(), p.memory.weights);
  EXPECT_EQ(p.overlap_min_rows, 2 * 1024 * 128 * 1024 / D);
  o.ring_rows = 2147483647 / p.minibatch_rows * p.minibatch_rows;
  p = plan_with(c, RoutingKind::kAllToOne, o);
  EXPECT_EQ(p.macrobatches, 1);
  EXPECT_GT(p.memory.layer_heap, 0);

  c.shape = LayerShape{64, 64, 8, 2, 0, 0};
  o = {};
  o.sm_count = 1024;
  o.tile_m = o.tile_n = 1024;
  o.ring_rows = 0;
  p = plan_with(c, RoutingKind::kZipf, o);
  EXPECT_EQ(p.overlap_min_rows, 2 * int64_t{1024} * 1024 * 1024 / 64);
  EXPECT_EQ(p.ring_rows % p.minibatch_rows, 0);
}

TEST(Planner, RejectsOptionsPastTheirBounds) {
  const LayerConfig c = config_for("kimi-k2", 8, 16);
  const auto expect_rejected = [&](const PlanOptions& o, const std::string& message) {
    try {
      plan_with(c, RoutingKind::kUniform, o);
      ADD_FAILURE() << "accepted; expected: " << message;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  };
  PlanOptions o;
  o.sm_count = int64_t{1} << 62;
  expect_rejected(o, "sms must be in [1, 1024], got 4611686018427387904");
  o.sm_count = 0;
  expect_rejected(o, "sms must be in [1, 1024], got 0");
  o = {};
  o.tile_n = int64_t{1} << 40;
  expect_rejected(o, "tile must be at most 1024x1024 (each side at least 1, e.g. 128x256), got 128x1099511627776");
  o = {};
  o.tile_m = 2048;
  expect_rejected(o, "got 2048x256");
  o = {};
  o.ring_rows = 9223372036854775807;
  expect_rejected(o, "ring_rows must be in [0, 2147483647] (0: automatic), got 9223372036854775807");
  o.ring_rows = -1;
  expect_rejected(o, "ring_rows must be in [0, 2147483647] (0: automatic), got -1");
}

TEST(Planner, RejectsBadOptions) {
  PlanOptions o;
  o.tflops = 0;
  EXPECT_THROW(plan_with(config_for("kimi-k2", 8, 16), RoutingKind::kUniform, o), Error);
  o = {};
  o.tile_m = 0;
  EXPECT_THROW(plan_with(config_for("kimi-k2", 8, 16), RoutingKind::kUniform, o), Error);
}

// The GEMM tiles the plan reports are the launchers' (caracal/gemm/gemm_tiles.hpp): one tile for
// every bf16 GEMM; in FP8 the dgrad's by D, wide from 4096 (DeepSeek-V3's 7168), narrow below
// (Qwen3-30B-A3B's 2048).
TEST(Planner, ReportsTheGemmTilesByPrecisionAndShape) {
  const auto dgrad_tile = [](const Plan& p) {
    for (const gemm::LayerGemmTile& g : p.gemm_tiles) {
      if (std::string(g.gemm) == "dgrad + SwiGLU") return g.tile;
    }
    ADD_FAILURE() << "no dgrad row";
    return gemm::GemmTile{0, 0, 0};
  };
  for (const char* model : {"deepseek-v3", "qwen3-30b-a3b"}) {
    LayerConfig c = config_for(model, 8, 256);
    const Plan bf16 = plan_with(c, RoutingKind::kUniform);
    ASSERT_EQ(bf16.gemm_tiles.size(), 5u);
    for (const gemm::LayerGemmTile& g : bf16.gemm_tiles) {
      EXPECT_EQ(g.tile.n, 256) << g.gemm;
      EXPECT_EQ(g.tile.k, 64) << g.gemm;
      EXPECT_STREQ(g.rule, "") << g.gemm;
    }
    c.precision = Precision::kFP8;
    const Plan fp8 = plan_with(c, RoutingKind::kUniform);
    const bool long_k = c.shape.hidden >= 4096;
    EXPECT_EQ(dgrad_tile(fp8).n, long_k ? 256 : 128) << model;
    EXPECT_EQ(dgrad_tile(fp8).k, 128) << model;
    EXPECT_EQ(fp8.gemm_tiles.back().tile.n, 128) << "the FP8 weight gradients, " << model;
  }
  EXPECT_TRUE(gemm::fp8_dgrad_wide_tiles(7168));
  EXPECT_FALSE(gemm::fp8_dgrad_wide_tiles(2048));
}

}  // namespace
}  // namespace caracal

