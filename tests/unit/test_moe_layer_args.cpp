// MoELayer's host-side pieces, without a GPU: memory sizing, configuration checks, what the ranks
// of a world must agree on, the argument checks that need no CUDA call
// (src/layer/argument_checks.hpp) and the weight layout helpers.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "caracal/comm/world.hpp"
#include "caracal/error.hpp"
#include "caracal/gemm/grouped_gemm_backward.hpp"
#include "caracal/gemm/expert_pass_fp8.hpp"
#include "caracal/moe_layer.hpp"
#include "caracal/plan.hpp"
#include "caracal/presets.hpp"
#include "caracal/row_format.hpp"
#include "caracal/transfer/exchange_shape.hpp"
#include "caracal/transfer/token_exchange.hpp"
#include "error_checks.hpp"
#include "fused/forward_tasks.cuh"  // src/: ProducerScratch
#include "fused/fused_forward.hpp"
#include "layer/argument_checks.hpp"
#include "layer/layer_sizes.hpp"

namespace caracal {
namespace {

LayerConfig small_config(bool shared) {
  LayerConfig c;
  c.shape.hidden = 256;
  c.shape.intermediate = 128;
  c.shape.num_experts = 16;
  c.shape.top_k = 4;
  c.shape.num_shared_experts = shared ? 1 : 0;
  c.shape.shared_intermediate = shared ? 192 : 0;
  c.ep_size = 8;
  c.tokens_per_rank = 133;
  return c;
}

using test::expect_error;

// Fake device addresses: the pure checks never dereference them.
template <typename T>
T* fake(uintptr_t offset = 0) {
  return reinterpret_cast<T*>(uintptr_t(1) << 20 | offset);
}

TEST(MoELayerSizes, RowsCoverTheWorstCase) {
  const layer::LayerSizes s = layer::layer_sizes(small_config(true));
  // W*T*k + L*127 = 4256 + 254 = 4510 rows of capacity, rounded down to 128.
  EXPECT_EQ(s.routed_rows, 4480);
  EXPECT_EQ(s.shared_rows, 256);
  EXPECT_EQ(s.local_experts, 2);
  EXPECT_TRUE(s.has_shared);
}

TEST(MoELayerSizes, TheFusedLayersRowBuffersAreItsRing) {
  const LayerConfig c = small_config(false);
  EXPECT_EQ(layer::layer_sizes(c).ring_rows, 4480);  // v1: every row
  EXPECT_EQ(layer::layer_sizes(c, 1024).ring_rows, 1024);
  EXPECT_TRUE(layer::layer_sizes(c, 1024).has_ring_past_rows());
  EXPECT_EQ(layer::layer_sizes(c, 8192).ring_rows, 4480);  // never more than the rows
  EXPECT_FALSE(layer::layer_sizes(c, 8192).has_ring_past_rows());
  EXPECT_TRUE(layer::layer_sizes(c, 1024).weight_grad_partials);          // bf16 gradients may come
  EXPECT_FALSE(layer::layer_sizes(c, 1024, false).weight_grad_partials);  // fp32 ones only
  EXPECT_FALSE(layer::layer_sizes(c, 8192).weight_grad_partials);         // one macrobatch: none needed
  expect_error([&] { layer::layer_sizes(c, 1000); }, {"ring_rows must be 0 or a multiple of 128", "got 1000"});
}

// Bytes of `count` elements of `bytes` each, 256-byte aligned (the layouts' rule).
size_t aligned_bytes(size_t count, size_t bytes) { return (count * bytes + 255) / 256 * 256; }

// The one place that sizes a precision's rows and weights (caracal/row_format.hpp).
TEST(RowFormat, SizesRowsAndWeightsPerPrecision) {
  constexpr RowFormat bf16 = row_format(Precision::kBF16);
  EXPECT_EQ(bf16.row_bytes(7168), 7168 * 2);
  EXPECT_EQ(bf16.scale_bytes(7168), 0);
  constexpr RowFormat fp8 = row_format(Precision::kFP8);
  EXPECT_EQ(fp8.row_bytes(7168), 7168 + 56 * 4);  // e4m3 values and one fp32 per 1 x 128 block
  EXPECT_EQ(fp8.row_bytes(200), 200 + 2 * 4);     // a partial block has its own scale
  EXPECT_EQ(weight_bytes(2048, 7168, Precision::kBF16), 2048 * 7168 * 2);
  EXPECT_EQ(weight_bytes(2048, 7168, Precision::kFP8), 2048 * 7168 + 16 * 56 * 4);
  EXPECT_EQ(weight_bytes(130, 130, Precision::kFP8), 130 * 130 + 2 * 2 * 4);
}

// The exchange's pulled rows (x, expert_x, dy, expert_dy) take their bytes from the shape's
// precision; the pulls move no scales yet, so a scaled precision is refused by name.
TEST(RowFormat, TheExchangeSizesItsPulledRowsByPrecision) {
  transfer::ExchangeShape shape{133, 4, 256, 16, 128};
  EXPECT_EQ(transfer::exchange_sizes(shape, 8).pulled_row_bytes, 256 * 2);
  shape.precision = Precision::kFP8;
  expect_error([&] { transfer::exchange_sizes(shape, 8); }, {"precision", "bf16", "fp8"});
  EXPECT_EQ(layer::exchange_shape(small_config(false)).precision, Precision::kBF16);
  EXPECT_EQ(layer::layer_sizes(small_config(false)).rows.row_bytes(256), 256 * 2);
}

TEST(MoELayerMemory, HeapIsTheExchangesAndLocalHoldsTheActivations) {
  for (bool shared : {false, true}) {
    const LayerConfig c = small_config(shared);
    // The default ring holds a balanced step (caracal::default_ring_rows: 33,792 rows for 132 SMs
    // here), so all 4,480 rows: one macrobatch.
    const MoELayerMemory m = MoELayer::memory(c);
    const layer::LayerSizes sizes = layer::layer_sizes(c, 4480);
    EXPECT_EQ(m.heap, transfer::TokenExchange::heap_bytes(layer::exchange_shape(c), 8,
                                                         layer::exchange_options(c, {}, {}, sizes)));
    EXPECT_EQ(MoELayer::heap_bytes(c), m.heap);
    // The fused backward's ring of dx rows (summed per (token, rank) before they go home): one row
    // per ring row; with a dx row per route, or a row per route both ways, none.
    const size_t dx_ring = aligned_bytes(4480 * 256, 2);
    layer::LayerExperiments dx_per_route;
    dx_per_route.dx_rows_per_route = true;
    EXPECT_EQ(layer::ExperimentalLayer::memory(c, {}, dx_per_route).heap, m.heap - dx_ring);
    layer::LayerExperiments per_route;
    per_route.rows_per_route = true;
    EXPECT_EQ(layer::ExperimentalLayer::memory(c, {}, per_route).heap, m.heap - dx_ring);
    // v1 (and a world of more ranks than the fused path runs on) keeps an output row per schedule
    // row and pulls rows into buffers of the exchange's whole capacity: 4,510 rows x 256 x 2 bytes,
    // against the ring's 4,480 for expert_x and expert_dy.
    MoELayerOptions v1;
    v1.fused_forward = false;
    EXPECT_EQ(MoELayer::heap_bytes(c, v1), m.heap - dx_ring + aligned_bytes(4510 * 256, 2) +
                                               2 * (aligned_bytes(4510 * 256, 2) - aligned_bytes(4480 * 256, 2)));
    const size_t rows = 4480;
    // gate_up (the backward's d_gate_up over it), activation; the router-gradient workspace.
    size_t routed = rows * (2 * 128 + 128) * 2 + gemm::down_dgrad_workspace_floats(4480, 128) * 4;
    EXPECT_GE(m.local, routed);
    if (shared) {
      const size_t shared_rows = 256;
      routed += shared_rows * 256 * 2 * 3 + shared_rows * (2 * 192 + 192) * 2;  // x (dx over it), out, dy; activations
      EXPECT_GE(m.local, routed);
    }
    // Beyond them: 256-byte alignment of each buffer, the fused kernels' counters and task slots,
    // and the forward producers' scratch (a task cursor per CTA).
    const size_t producer_scratch = size_t(fused::kFusedMaxCtasPerRank) * sizeof(fused::ProducerScratch);
    EXPECT_LT(m.local, routed + 64 * 1024 + producer_scratch) << "beyond the activations and the fused kernels' words";
    EXPECT_EQ(MoELayer::memory(c, v1).local, m.local);  // the same rows: the ring holds them all

    // A ring of 1,024 rows: expert_x, expert_dy, expert_dx, gate_up and activation hold 1,024 rows, and two
    // fp32 partial sums of one expert's weight gradients (3 x 256 x 128 floats) carry bf16 weight
    // gradients across the macrobatches.
    MoELayerOptions ring;
    ring.ring_rows = 1024;
    const MoELayerMemory r = MoELayer::memory(c, ring);
    EXPECT_EQ(m.heap - r.heap, 3 * (aligned_bytes(4480 * 256, 2) - aligned_bytes(1024 * 256, 2)));
    EXPECT_EQ(m.local - r.local + 2 * aligned_bytes(gemm::weight_grad_partial_floats(256, 128), 4),
              aligned_bytes(4480 * 2 * 128, 2) + aligned_bytes(4480 * 128, 2) - aligned_bytes(1024 * 2 * 128, 2) -
                  aligned_bytes(1024 * 128, 2));
    // Built for fp32 weight gradients only: no partials.
    ring.bf16_weight_gradients = false;
    EXPECT_EQ(r.local - MoELayer::memory(c, ring).local, 2 * aligned_bytes(gemm::weight_grad_partial_floats(256, 128), 4));
    EXPECT_EQ(MoELayer::memory(c, ring).heap, r.heap);
  }
}

// An FP8 layer runs v1's buffers plus its e4m3 rows and scales (x, the activation, dy, d_gate_up)
// and its quantized weights (both orientations) in the local block, and expert_dx in the heap.
TEST(MoELayerMemory, Fp8AddsItsScaledRowsAndWeights) {
  LayerConfig fp8 = small_config(false);
  fp8.precision = Precision::kFP8;
  MoELayerOptions v1;
  v1.fused_forward = false;
  const MoELayerMemory f = MoELayer::memory(fp8), b = MoELayer::memory(small_config(false), v1);
  EXPECT_EQ(f.heap, MoELayer::memory(fp8, v1).heap) << "an FP8 layer runs v1's launches";
  EXPECT_GT(f.heap, b.heap) << "expert_dx, x in e4m3 at home and on the expert side";
  const size_t rows = 4480, L = 2;  // as LayerSizes' test: W*T*k + L*127 rounded down to 128
  const auto scaled = [&](size_t cols) { return aligned_bytes(rows * cols, 1) + aligned_bytes(cols / 128 * rows, 4); };
  const gemm::Fp8ExpertWeightSizes w = gemm::fp8_expert_weight_sizes(int(L), 256, 128);
  const size_t weights = 2 * aligned_bytes(w.w_gate_up_codes, 1) + aligned_bytes(w.w_gate_up_scales, 4) +
                         aligned_bytes(w.w_gate_up_scales_t, 4) + 2 * aligned_bytes(w.w_down_codes, 1) +
                         aligned_bytes(w.w_down_scales, 4) + aligned_bytes(w.w_down_scales_t, 4);
  const size_t workspace = aligned_bytes(gemm::fp8_down_dgrad_workspace_floats(int(rows), 128), 4) -
                           aligned_bytes(gemm::down_dgrad_workspace_floats(int(rows), 128), 4);
  // The fused FP8 forward's task table after its counters: 35 row blocks' up/gate tile (2I = 256),
  // down tile (D = 256) and group sums, 8 words a task. bf16's forward reads none.
  const size_t bf16_words = fused::ready_counter_words(int(rows), 0);
  const size_t fp8_words = fused::fp8_ready_counter_words(int(rows), 0, 256, 128);
  EXPECT_EQ(fp8_words - bf16_words, 35 * 3 * 8);
  const size_t table = aligned_bytes(fp8_words, 4) - aligned_bytes(bf16_words, 4);
  // The activation, dy and d_gate_up in e4m3 (x's are in the heap: TokenExchange::dispatch_fp8).
  EXPECT_EQ(f.local - b.local, scaled(128) + scaled(256) + scaled(2 * 128) + weights + workspace + table);
}

// With a shared expert (Is = 384) the FP8 layer also holds its rows in e4m3 (x, the activation, dy,
// d_gate_up over the shared rows: T rounded up to 128), its quantized weights beside the routed
// experts' (MoELayer::fp8_weight_bytes) and its dgrad's partials per 128 columns.
TEST(MoELayerMemory, Fp8SharedExpertAddsItsScaledRowsAndWeights) {
  LayerConfig bf16 = small_config(true);
  bf16.shape.shared_intermediate = 384;
  LayerConfig fp8 = bf16;
  fp8.precision = Precision::kFP8;
  MoELayerOptions v1;
  v1.fused_forward = false;
  const MoELayerMemory f = MoELayer::memory(fp8), b = MoELayer::memory(bf16, v1);
  const size_t rows = 4480, shared_rows = 256, L = 2, D = 256, I = 128, Is = 384;
  const auto scaled = [](size_t r, size_t cols) { return aligned_bytes(r * cols, 1) + aligned_bytes(cols / 128 * r, 4); };
  const auto weights = [](const gemm::Fp8ExpertWeightSizes& w) {
    return 2 * aligned_bytes(w.w_gate_up_codes, 1) + aligned_bytes(w.w_gate_up_scales, 4) +
           aligned_bytes(w.w_gate_up_scales_t, 4) + 2 * aligned_bytes(w.w_down_codes, 1) +
           aligned_bytes(w.w_down_scales, 4) + aligned_bytes(w.w_down_scales_t, 4);
  };
  const auto workspace = [](size_t r, size_t i) {
    return aligned_bytes(gemm::fp8_down_dgrad_workspace_floats(int(r), int(i)), 4) -
           aligned_bytes(gemm::down_dgrad_workspace_floats(int(r), int(i)), 4);
  };
  const size_t routed = scaled(rows, I) + scaled(rows, D) + scaled(rows, 2 * I) +
                        weights(gemm::fp8_expert_weight_sizes(int(L), int(D), int(I))) + workspace(rows, I);
  const size_t shared = 2 * scaled(shared_rows, D) + scaled(shared_rows, Is) + scaled(shared_rows, 2 * Is) +
                        weights(gemm::fp8_expert_weight_sizes(1, int(D), int(Is))) + workspace(shared_rows, Is);
  const size_t table = aligned_bytes(fused::fp8_ready_counter_words(int(rows), int(shared_rows), int(D), int(I)), 4) -
                       aligned_bytes(fused::ready_counter_words(int(rows), int(shared_rows)), 4);  // as above
  EXPECT_EQ(f.local - b.local, routed + shared + table);
}

TEST(MoELayerMemory, RefusesConfigurationsTheLayerCannotRun) {
  LayerConfig fp8 = small_config(false);
  fp8.precision = Precision::kFP8;
  fp8.shape.hidden = 192;
  expect_error([&] { MoELayer::memory(fp8); }, {"MoELayer: invalid LayerConfig", "hidden must be a multiple of 128"});
  LayerConfig odd = small_config(false);
  odd.shape.hidden = 100;
  expect_error([&] { MoELayer::memory(odd); }, {"MoELayer: invalid LayerConfig", "hidden must be a multiple of 64"});
  // Validated before the default ring is sized from it (num_experts / ep_size).
  LayerConfig no_ranks = small_config(false);
  no_ranks.ep_size = 0;
  expect_error([&] { MoELayer::memory(no_ranks); }, {"MoELayer: invalid LayerConfig", "ep_size must be at least 1"});
}

// ---- What the ranks of a world must agree on (the constructor's collective check) -------------

// "" where two ranks holding these would agree, else the message the constructor gives.
std::string disagreement(const LayerConfig& a, const MoELayerOptions& options_a, int sms_a, const LayerConfig& b,
                         const MoELayerOptions& options_b, int sms_b, const layer::LayerExperiments& experiments_b = {}) {
  const std::vector<layer::AgreedValue> rank0 = layer::values_ranks_agree_on(a, options_a, {}, sms_a);
  const std::vector<layer::AgreedValue> rank1 = layer::values_ranks_agree_on(b, options_b, experiments_b, sms_b);
  EXPECT_EQ(rank0.size(), rank1.size());
  std::vector<const char*> names;
  std::vector<int64_t> values;
  for (const layer::AgreedValue& v : rank0) names.push_back(v.name);
  for (const auto* rank : {&rank0, &rank1}) {
    for (const layer::AgreedValue& v : *rank) values.push_back(v.value);
  }
  return comm::detail::first_mismatch(names, values, 2);
}

std::string disagreement(const LayerConfig& c, const MoELayerOptions& b, int sms = 132,
                         const layer::LayerExperiments& experiments_b = {}) {
  return disagreement(c, MoELayerOptions{}, 132, c, b, sms, experiments_b);
}

TEST(MoELayerAgreement, EveryOptionThatShapesTheHeapOrTheTrafficIsCompared) {
  const LayerConfig c = small_config(true);  // W = 8: the fused path
  const MoELayerMemory defaults = MoELayer::memory(c, {}, 132);
  EXPECT_EQ(disagreement(c, {}), "");
  struct Case {
    const char* field;
    MoELayerOptions options;
    layer::LayerExperiments experiments;
  };
  std::vector<Case> cases(4);
  cases[0] = {"fused_forward (as run", {}, {}};
  cases[0].options.fused_forward = false;
  cases[1] = {"dx_rows_per_route (as run", {}, {}};
  cases[1].experiments.dx_rows_per_route = true;
  cases[2] = {"rows_per_route differs", {}, {}};
  cases[2].experiments.rows_per_route = true;
  cases[3] = {"ring_rows (as run", {}, {}};
  cases[3].options.ring_rows = 1024;
  for (const Case& k : cases) {
    SCOPED_TRACE(k.field);
    const std::string message = disagreement(c, k.options, 132, k.experiments);
    EXPECT_EQ(message.rfind(k.field, 0), 0u) << message;
    // Each moves the heap's offsets: the catch-all differs too.
    EXPECT_NE(layer::ExperimentalLayer::memory(c, k.options, k.experiments, 132).heap, defaults.heap);
  }
  // Any field of the configuration.
  LayerConfig other = c;
  other.tokens_per_rank = 134;
  EXPECT_EQ(disagreement(c, {}, 132, other, {}, 132).rfind("tokens_per_rank differs (rank 0: 133, rank 1: 134)", 0),
            0u);
  other = c;
  other.router.scale = 2.5;
  EXPECT_EQ(disagreement(c, {}, 132, other, {}, 132).rfind("router.scale (bits) differs", 0), 0u);
}

TEST(MoELayerAgreement, TheDefaultRingIsComparedAsEachDeviceResolvesIt) {
  LayerConfig c;
  c.shape = find_model_preset("deepseek-v3").shape;
  c.ep_size = 8;
  c.tokens_per_rank = 4096;
  // 132 SMs (H200): a minibatch of 2,176 rows, a ring of 36,992; 114 (H100 PCIe): 1,920 and 38,400.
  EXPECT_EQ(disagreement(c, {}, 114),
            "ring_rows (as run: the default follows the device's SMs; 0 without the fused forward) differs "
            "(rank 0: 36992, rank 1: 38400)");
  MoELayerOptions fixed;
  fixed.ring_rows = 36992;
  EXPECT_EQ(disagreement(c, fixed, 132, c, fixed, 114), "");
  EXPECT_EQ(disagreement(c, fixed), "");  // the default, given explicitly
}

TEST(MoELayerAgreement, RankLocalOptionsAndOptionsNotRunAreNotCompared) {
  const LayerConfig c = small_config(true);
  MoELayerOptions local;
  local.gemm_ctas = 64;
  local.exchange_sms = 32;
  local.fused_comm_ctas = 3;
  local.bf16_weight_gradients = false;
  local.local_allocator = {[](size_t) -> void* { return nullptr; }, [](void*) {}};
  layer::LayerExperiments pull_all_rows;
  pull_all_rows.pull_all_rows = true;
  EXPECT_EQ(disagreement(c, local, 132, pull_all_rows), "");
  // Past 8 ranks both run v1: the fused path's options do not apply.
  LayerConfig wide = c;
  wide.shape.num_experts = 32;
  wide.ep_size = 16;
  MoELayerOptions v1;
  v1.fused_forward = false;
  v1.ring_rows = 1024;
  layer::LayerExperiments dx_per_route;
  dx_per_route.dx_rows_per_route = true;
  EXPECT_EQ(disagreement(wide, {}, 132, wide, v1, 114, dx_per_route), "");
}

TEST(MoELayerAgreement, InvalidConfigurationsAreComparedWithoutThrowing) {
  LayerConfig bad = small_config(false);
  bad.ep_size = 0;
  std::vector<layer::AgreedValue> values;
  EXPECT_NO_THROW(values = layer::values_ranks_agree_on(bad, {}, {}, 132));
  ASSERT_GE(values.size(), 2u);
  EXPECT_EQ(values.back().value, -1);  // the heap's bytes: none, refused after the comparison
  MoELayerOptions odd_ring;
  odd_ring.ring_rows = 1000;
  EXPECT_NO_THROW(values = layer::values_ranks_agree_on(small_config(false), odd_ring, {}, 132));
  // Two ranks invalid in different ways still learn that they differ.
  EXPECT_EQ(disagreement(small_config(false), odd_ring, 132, bad, {}, 132).rfind("ep_size differs", 0), 0u);
}

MoEForwardArgs valid_forward(bool shared) {
  MoEForwardArgs a;
  a.x = fake<const __nv_bfloat16>(0x100);
  a.topk_idx = fake<const int32_t>(0x200);
  a.topk_scores = fake<const float>(0x300);
  a.weights.w_gate_up = fake<const __nv_bfloat16>(0x400);
  a.weights.w_down = fake<const __nv_bfloat16>(0x500);
  if (shared) {
    a.weights.shared_w_gate_up = fake<const __nv_bfloat16>(0x600);
    a.weights.shared_w_down = fake<const __nv_bfloat16>(0x700);
  }
  a.y = fake<__nv_bfloat16>(0x800);
  return a;
}

void check_forward(const MoEForwardArgs& a, bool shared) {
  layer::check_pointer_args(layer::forward_pointer_args(a, layer::layer_sizes(small_config(shared))),
                            "MoELayer::forward", 3);
}

TEST(MoELayerArgs, ForwardPointers) {
  EXPECT_NO_THROW(check_forward(valid_forward(true), true));
  EXPECT_NO_THROW(check_forward(valid_forward(false), false));

  MoEForwardArgs a = valid_forward(true);
  a.x = nullptr;
  expect_error([&] { check_forward(a, true); },
               {"MoELayer::forward: ranks[3].x must be a 16-byte aligned device pointer to [T=133][D=256] bf16",
                "got null"});
  a = valid_forward(true);
  a.topk_idx = fake<const int32_t>(0x202);
  expect_error([&] { check_forward(a, true); }, {"ranks[3].topk_idx must be 4-byte aligned", "[T=133][k=4] int32"});
  a = valid_forward(true);
  a.weights.w_gate_up = fake<const __nv_bfloat16>(0x408);
  expect_error([&] { check_forward(a, true); },
               {"ranks[3].weights.w_gate_up must be 16-byte aligned", "[L=2][2I=256][D=256] bf16"});
  a = valid_forward(true);
  a.weights.shared_w_down = nullptr;
  expect_error([&] { check_forward(a, true); }, {"ranks[3].weights.shared_w_down", "[D=256][Is=192] bf16", "got null"});
  a = valid_forward(true);
  a.shared_scale = fake<const float>(0x900);
  EXPECT_NO_THROW(check_forward(a, true)) << "the shared-output scale is optional";

  a = valid_forward(false);
  a.shared_scale = fake<const float>(0x900);
  expect_error([&] { check_forward(a, false); },
               {"ranks[3].shared_scale must be null: the layer has no shared expert"});
  a = valid_forward(false);
  a.weights.shared_w_gate_up = fake<const __nv_bfloat16>(0x600);
  expect_error([&] { check_forward(a, false); }, {"ranks[3].weights.shared_w_gate_up must be null"});

  a = valid_forward(false);
  a.weights.w_gate_up_layout = gemm::GateUpLayout::kHalves;
  EXPECT_NO_THROW(layer::check_gate_up_layout(a.weights, "MoELayer::forward", 3));
  a.weights.w_gate_up_layout = static_cast<gemm::GateUpLayout>(7);
  expect_error([&] { layer::check_gate_up_layout(a.weights, "MoELayer::forward", 3); },
               {"MoELayer::forward: ranks[3].weights.w_gate_up_layout must be gemm::GateUpLayout::kInterleaved or "
                "kHalves, got 7"});
}

MoEBackwardArgs valid_backward(bool shared, bool scaled) {
  MoEBackwardArgs a;
  a.dy = fake<const __nv_bfloat16>(0x100);
  a.dx = fake<__nv_bfloat16>(0x200);
  a.d_topk_scores = fake<float>(0x300);
  a.d_w_gate_up = fake<float>(0x400);
  a.d_w_down = fake<float>(0x500);
  if (shared) {
    a.d_shared_w_gate_up = fake<float>(0x600);
    a.d_shared_w_down = fake<float>(0x700);
  }
  if (scaled) a.d_shared_scale = fake<float>(0x800);
  return a;
}

void check_backward(const MoEBackwardArgs& a, bool shared, bool scaled) {
  layer::check_pointer_args(layer::backward_pointer_args(a, layer::layer_sizes(small_config(shared)), scaled),
                            "MoELayer::backward", 0);
}

TEST(MoELayerArgs, BackwardPointers) {
  EXPECT_NO_THROW(check_backward(valid_backward(true, true), true, true));
  EXPECT_NO_THROW(check_backward(valid_backward(true, false), true, false));
  EXPECT_NO_THROW(check_backward(valid_backward(false, false), false, false));

  MoEBackwardArgs a = valid_backward(true, false);
  a.d_w_down = fake<float>(0x504);
  expect_error([&] { check_backward(a, true, false); },
               {"MoELayer::backward: ranks[0].d_w_down must be 16-byte aligned", "[L=2][D=256][I=128] fp32"});
  expect_error([&] { check_backward(valid_backward(true, false), true, true); },
               {"ranks[0].d_shared_scale", "the forward was given a shared_scale", "got null"});
  expect_error([&] { check_backward(valid_backward(true, true), true, false); },
               {"ranks[0].d_shared_scale must be null: the forward was given no shared_scale"});
  expect_error([&] { check_backward(valid_backward(true, false), false, false); },
               {"ranks[0].d_shared_w_gate_up must be null: the layer has no shared expert"});
}

TEST(MoELayerArgs, OneStructPerLocalRank) {
  EXPECT_NO_THROW(layer::check_rank_count(8, 8, "MoELayer::forward"));
  expect_error([] { layer::check_rank_count(1, 8, "MoELayer::forward"); },
               {"MoELayer::forward: expected one argument struct per local rank (8), got 1"});
}

TEST(MoELayerWeights, DeinterleaveInvertsInterleave) {
  const int64_t experts = 2, I = 32, D = 16;
  std::vector<uint16_t> gate(experts * I * D), up(gate.size());
  for (size_t i = 0; i < gate.size(); ++i) {
    gate[i] = static_cast<uint16_t>(i);
    up[i] = static_cast<uint16_t>(i + 40000);
  }
  std::vector<uint16_t> gate_up(2 * gate.size()), gate_back(gate.size()), up_back(gate.size());
  interleave_gate_up_weights_host(gate.data(), up.data(), gate_up.data(), experts, I, D);
  deinterleave_gate_up_host(gate_up.data(), gate_back.data(), up_back.data(), experts, I, D);
  EXPECT_EQ(gate_back, gate);
  EXPECT_EQ(up_back, up);
  EXPECT_EQ(gate_up[static_cast<size_t>(gate_up_row(8, true) * D)], up[static_cast<size_t>(8 * D)]);
}


// The planner reports the layer's memory (fused over the plan's ring, and v1's) from its own count
// of the layer's buffers; the layer's exact figure (MoELayer::memory, which adds 256-byte
// alignment) must stay within 0.1% of it, at 1,000 tokens per rank (a ring at least as long as the
// rows at EP 1, shorter at EP 8) and at 4,096.
TEST(MoELayerMemory, PlannerReportsTheLayersMemory) {
  const auto expect_within = [](int64_t planned, size_t exact, const char* what) {
    EXPECT_NEAR(static_cast<double>(planned), static_cast<double>(exact), 0.001 * static_cast<double>(exact)) << what;
  };
  for (const char* model : {"deepseek-v3", "kimi-k2", "qwen3.5-397b", "gpt-oss-120b"}) {
    for (int64_t ep : {1, 8}) {
      for (int64_t tokens : {1000, 4096}) {
        LayerConfig config;
        config.shape = find_model_preset(model).shape;
        config.ep_size = ep;
        config.tokens_per_rank = tokens;
        SCOPED_TRACE(std::string(model) + " ep " + std::to_string(ep) + " T " + std::to_string(tokens));
        const Routing routing =
            make_routing(RoutingSpec{}, ep, config.tokens_per_rank, config.shape.top_k, config.shape.num_experts);
        const Plan plan = make_plan(config, routing, "uniform", {});
        const MoELayerMemory exact = MoELayer::memory(config, {}, 132);  // the plan's SMs
        expect_within(plan.memory.layer_heap, exact.heap, "heap");
        expect_within(plan.memory.layer_local, exact.local, "local");
        MoELayerOptions v1;
        v1.fused_forward = false;
        const MoELayerMemory exact_v1 = MoELayer::memory(config, v1);
        expect_within(plan.memory.v1_layer_heap, exact_v1.heap, "v1 heap");
        expect_within(plan.memory.v1_layer_local, exact_v1.local, "v1 local");
        // A layer for fp32 weight gradients only, and the plan that says so.
        PlanOptions fp32_grads;
        fp32_grads.bf16_weight_gradients = false;
        const Plan fp32_plan = make_plan(config, routing, "uniform", fp32_grads);
        MoELayerOptions fp32_layer;
        fp32_layer.bf16_weight_gradients = false;
        expect_within(fp32_plan.memory.layer_local, MoELayer::memory(config, fp32_layer, 132).local, "fp32 local");
        EXPECT_EQ(plan.memory.layer_local - fp32_plan.memory.layer_local, plan.memory.partials);
        // The FP8 layer as it runs today (v1's launches), where the shape allows FP8.
        if (config.shape.hidden % 128 != 0 || config.shape.intermediate % 128 != 0 ||
            config.shape.shared_intermediate % 128 != 0) {
          continue;
        }
        LayerConfig fp8 = config;
        fp8.precision = Precision::kFP8;
        const Plan fp8_plan = make_plan(fp8, routing, "uniform", {});
        const MoELayerMemory exact_fp8 = MoELayer::memory(fp8, {}, 132);
        expect_within(fp8_plan.memory.fp8_layer_heap, exact_fp8.heap, "fp8 heap");
        expect_within(fp8_plan.memory.fp8_layer_local, exact_fp8.local, "fp8 local");
        EXPECT_EQ(fp8_plan.roofline.today_forward_nvlink_bytes, fp8_plan.roofline.forward_nvlink_bytes)
            << "x crosses in e4m3 in the forward, as the design has it";
        if (fp8_plan.roofline.forward_pull_bf16_bytes > 0) {  // rows cross between ranks
          const double D = static_cast<double>(config.shape.hidden);
          EXPECT_DOUBLE_EQ(static_cast<double>(fp8_plan.roofline.forward_pull_bytes) /
                               static_cast<double>(fp8_plan.roofline.forward_pull_bf16_bytes),
                           (D + D / 32) / (2 * D))
              << "the pull's rows: e4m3 and one fp32 scale per 128, over bf16's";
          EXPECT_EQ(fp8_plan.roofline.forward_pull_bf16_bytes, plan.roofline.forward_pull_bytes)
              << "the bf16 plan pulls the same rows in bf16";
        }
        EXPECT_LE(fp8_plan.roofline.today_backward_nvlink_bytes, plan.roofline.v1_backward_nvlink_bytes)
            << "the FP8 backward pulls dy in e4m3 once per (token, rank) (bf16 v1: bf16 per route), dx per route";
        EXPECT_EQ(fp8_plan.memory.fp8_layer_weights, plan.memory.weights) << "an FP8 layer's weights stay bf16";
      }
    }
  }
}
}  // namespace
}  // namespace caracal
