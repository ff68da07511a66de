// Tests of the FP8 layer (LayerConfig::precision = kFP8: v1's launches with the routed and shared
// experts' gemm::Fp8ExpertPass; x pulled in e4m3, dy in bf16).
//   GPU: every output of every rank against the fp64 reference of the unquantized layer, within
//   bounds of what e4m3 costs (checks::kFp8LayerBounds, ~3x the measured errors); loopback worlds of
//   1, 2, 4 and 8 ranks, adversarial routings (Zipf, all to one expert, empty slots); bitwise
//   repeats; a backward after another forward (the replay); a CUDA graph replayed with new
//   routing and inputs (the eager bits); the fused FP8 forward (a test switch) against the separate
//   launches, bit for bit; the [gate; up] halves refused by
//   name; against the fp64 reference of the quantized operands too (the bound that measures the
//   kernels, with the bf16 weight-gradient GEMMs the reference models); the FP8 weight gradients
//   (MoELayerOptions::fp8_weight_gradients, the default) against the bf16 GEMMs' on the same layer,
//   every other output bit for bit. Cases with a shared expert (kFp8SharedIntermediate) and a
//   shared-output scale among them.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "caracal/error.hpp"
#include "caracal/moe_layer.hpp"
#include "exchange_test_support.hpp"
#include "gpu_test_util.hpp"
#include "moe_layer_test_support.hpp"

namespace caracal::layer_test {
namespace {

std::vector<LayerCase> fp8_cases() {
  using R = RoutingCase;
  constexpr Precision kFP8 = Precision::kFP8;
  return {
      {"W1_uniform_k2_shared_scale", 1, 133, 8, 2, true, true, kNormalized, R::kUniform, kFP8},
      {"W2_zipf_k4_unnormalized", 2, 97, 8, 4, false, false, kUnnormalized, R::kZipf, kFP8},
      {"W4_all_to_one_k4", 4, 61, 16, 4, false, false, kNormalizedScaled, R::kAllToOne, kFP8},
      {"W4_empty_slots_k3_shared", 4, 45, 8, 3, true, false, kNormalized, R::kEmptySlots, kFP8},
      {"W8_uniform_k2", 8, 29, 16, 2, false, false, kNormalized, R::kUniform, kFP8},
  };
}

class GpuMoELayerFp8 : public testing::TestWithParam<LayerCase> {};

TEST_P(GpuMoELayerFp8, CloseToTheUnquantizedReference) {
  CARACAL_REQUIRE_GPU();
  const LayerCase& c = GetParam();
  const SeededStep s(c, c.routing);
  LoopbackLayer l(c, s.weights);
  EXPECT_EQ(l.layer.ring_rows(), 0) << "an FP8 layer runs v1's launches";
  l.buffers.prepare(s.step, l.world);
  const Stream stream;
  ASSERT_NO_THROW(run_step(l.layer, l.buffers, stream));
  const StepExpected want = reference_step(c, reference_layer(c, s.weights), s.step, 0, false, false);
  for (const std::string& f : step_failures(c, s.step, want, l.buffers.download(), true, checks::kFp8LayerBounds)) {
    ADD_FAILURE() << f;
  }
}

// Against the fp64 reference of the quantized operands (ReferenceOptions::fp8_experts, whose weight
// gradients read the bf16 rows: the layer runs the bf16 weight-gradient GEMMs here): what is left
// is the kernels' own error (fp32 accumulation, FP8 wgmma's promotion every 128 of K), and where it
// tips a bf16 rounding the e4m3 code it feeds next (the activation's, d_gate_up's). ~3x the errors
// measured on an H100 (2026-12-06, over every case and rank): y 0.74% Frobenius, 3.5% the worst row;
// dx 0.60%, 2.3%; the weight gradients 0.13%, 0.17%; d_topk_scores |error| <= 5e-4 B_t; d_shared_scale
// (<dy, E_shared(x)> through the shared expert's FP8 GEMMs, one row) 0.095% over four seeds.
constexpr checks::LayerBounds kFp8KernelBounds{{2.2e-2, 1.1e-1}, {1.8e-2, 7e-2}, {4e-3, 5e-3},
                                               {3e-3, 3e-3}, 1e-2, 1.5e-3};

TEST_P(GpuMoELayerFp8, CloseToTheQuantizedReference) {
  CARACAL_REQUIRE_GPU();
  const LayerCase& c = GetParam();
  const SeededStep s(c, c.routing);
  MoELayerOptions options;
  options.fp8_weight_gradients = false;
  LoopbackLayer l(c, s.weights, options);
  l.buffers.prepare(s.step, l.world);
  const Stream stream;
  ASSERT_NO_THROW(run_step(l.layer, l.buffers, stream));
  checks::LayerRounding rounding;
  rounding.fp8_experts = true;
  const StepExpected want = reference_step(c, reference_layer(c, s.weights), s.step, rounding);
  for (const std::string& f : step_failures(c, s.step, want, l.buffers.download(), true, kFp8KernelBounds)) {
    ADD_FAILURE() << f;
  }
}

// The FP8 weight gradients (rows quantized down their columns) against the bf16 GEMMs' on the bf16
// rows of the same layer and step: relative Frobenius of each expert within kFp8WeightGradsOverBf16
// (what quantizing the four operands costs: 2.7-3.3% over a rank's experts on an H100, 2026-12-06;
// ~3x that); y, dx and d_topk_scores bit for bit (the weight gradients feed nothing); experts without
// rows exactly zero in both.
constexpr double kFp8WeightGradsOverBf16 = 0.1;

TEST_P(GpuMoELayerFp8, Fp8WeightGradientsCloseToTheBf16Gemms) {
  CARACAL_REQUIRE_GPU();
  const LayerCase& c = GetParam();
  const SeededStep s(c, c.routing);
  MoELayerOptions fp8_gemms, bf16_gemms;
  fp8_gemms.fp8_weight_gradients = true;
  bf16_gemms.fp8_weight_gradients = false;
  const std::vector<RankOutputs> fp8 = run_once(c, s, fp8_gemms);
  const std::vector<RankOutputs> bf16 = run_once(c, s, bf16_gemms);
  ASSERT_EQ(fp8.size(), bf16.size());
  const size_t expert_floats = size_t(kHidden) * size_t(kIntermediate);
  constexpr checks::ErrorBound kBound{kFp8WeightGradsOverBf16, kFp8WeightGradsOverBf16};
  for (size_t r = 0; r < fp8.size(); ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    EXPECT_TRUE(same_bits(fp8[r].y, bf16[r].y)) << "y";
    EXPECT_TRUE(same_bits(fp8[r].dx, bf16[r].dx)) << "dx";
    EXPECT_TRUE(same_bits(fp8[r].d_scores, bf16[r].d_scores)) << "d_topk_scores";
    ASSERT_EQ(fp8[r].d_w_gate_up.size(), bf16[r].d_w_gate_up.size());
    ASSERT_EQ(fp8[r].d_w_down.size(), bf16[r].d_w_down.size());
    // An expert a row (test::OutputError): each within the bound, one without rows exactly zero.
    const std::string rank = "rank " + std::to_string(r) + " fp8 over bf16 ";
    test::OutputError gate_up(rank + "d_w_gate_up"), down(rank + "d_w_down");
    const auto add = [&](test::OutputError& e, const std::vector<float>& got, const std::vector<float>& want,
                         size_t per_expert) {
      checks::add_rows(e, [&](size_t i) { return double(got[i]); }, std::vector<double>(want.begin(), want.end()),
                       want.size() / per_expert, per_expert);
    };
    add(gate_up, fp8[r].d_w_gate_up, bf16[r].d_w_gate_up, 2 * expert_floats);
    add(down, fp8[r].d_w_down, bf16[r].d_w_down, expert_floats);
    for (const test::OutputError* e : {&gate_up, &down}) {
      for (const std::string& f : e->failures(kBound)) ADD_FAILURE() << f;
    }
    const bool rows_here = std::any_of(bf16[r].d_w_down.begin(), bf16[r].d_w_down.end(), [](float v) { return v != 0.0f; });
    if (rows_here) {
      EXPECT_GT(gate_up.frobenius() + down.frobenius(), 0.0)
          << "the FP8 weight gradients are the bf16 GEMMs' bits: FP8 did not run";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuMoELayerFp8, testing::ValuesIn(fp8_cases()), case_name);

const LayerCase kRepeatCase{"W2_uniform_k4_shared_scale", 2, 97, 8, 4, true, true, kNormalized,
                            RoutingCase::kUniform, Precision::kFP8};
// In a world of one rank the forward's up/gate reads x's home codes in place (no dispatch_fp8), and
// x's columns for the weight gradients come from them; a replay dispatches and quantizes on the
// expert side instead: the two must give the same bits.
const LayerCase kRepeatCaseW1{"W1_uniform_k4_shared_scale", 1, 197, 8, 4, true, true, kNormalized,
                              RoutingCase::kUniform, Precision::kFP8};

TEST(GpuMoELayerFp8Steps, BitwiseRepeats) {
  CARACAL_REQUIRE_GPU();
  const SeededStep s(kRepeatCase, kRepeatCase.routing);
  expect_same_bits(run_once(kRepeatCase, s), run_once(kRepeatCase, s), "two FP8 layers, one step");
}

void expect_backward_after_another_forward(const LayerCase& c) {
  const SeededStep s(c, c.routing);
  const std::vector<RankOutputs> direct = run_once(c, s);
  LoopbackLayer l(c, s.weights);
  const Stream stream;
  l.buffers.prepare(s.step, l.world);
  const MoEContext first = l.layer.forward(l.buffers.forward_args(), stream.get());
  stream.sync();
  const std::vector<RankOutputs> with_y = l.buffers.download();
  const HostStep other = random_step(c, RoutingCase::kZipf, fresh_seed());
  l.buffers.prepare(other, l.world);
  (void)l.layer.forward(l.buffers.forward_args(), stream.get());
  stream.sync();
  l.buffers.prepare(s.step, l.world);  // the first step's inputs and dy again
  l.layer.backward(l.buffers.backward_args(), first, stream.get());
  stream.sync();
  EXPECT_NO_THROW(l.layer.check());
  std::vector<RankOutputs> replayed = l.buffers.download();
  for (size_t r = 0; r < replayed.size(); ++r) replayed[r].y = with_y[r].y;
  expect_same_bits(direct, replayed, "a backward after another forward");
}

// A backward after another forward of the same layer recomputes the first forward's activations
// (the replay), so it gives the bits of a backward right after its forward (at W = 1 the one read x
// in place, the replay dispatches it).
TEST(GpuMoELayerFp8Steps, BackwardAfterAnotherForward) {
  CARACAL_REQUIRE_GPU();
  for (const LayerCase& c : {kRepeatCase, kRepeatCaseW1}) {
    SCOPED_TRACE(c.name);
    ASSERT_NO_FATAL_FAILURE(expect_backward_after_another_forward(c));
  }
}

// Weights given quantized (MoELayer::quantize_weights into MoEWeights::w_fp8, as a training loop
// does once a step) give the bits of those the layer quantizes at every call; a block given over
// stale weights is read as it is (the layer does not quantize it again).
TEST(GpuMoELayerFp8Steps, WeightsGivenQuantizedGiveTheSameBits) {
  CARACAL_REQUIRE_GPU();
  const SeededStep s(kRepeatCase, kRepeatCase.routing);
  const std::vector<RankOutputs> own = run_once(kRepeatCase, s);
  LoopbackLayer l(kRepeatCase, s.weights);
  const Stream stream;
  l.buffers.prepare(s.step, l.world);
  std::vector<MoEForwardArgs> forward = l.buffers.forward_args();
  std::vector<test::DeviceBuffer<uint8_t>> blocks(forward.size());
  for (size_t r = 0; r < forward.size(); ++r) {
    ASSERT_NO_FATAL_FAILURE(blocks[r].allocate(l.layer.fp8_weight_bytes()));
    l.layer.quantize_weights(forward[r].weights, blocks[r].get(), stream.get());
    forward[r].weights.w_fp8 = blocks[r].get();
  }
  const MoEContext context = l.layer.forward(forward, stream.get());
  l.layer.backward(l.buffers.backward_args(), context, stream.get());
  stream.sync();
  EXPECT_NO_THROW(l.layer.check());
  expect_same_bits(own, l.buffers.download(), "weights given quantized");

  // A zeroed block: y is zero (the routed and shared experts read zero weights).
  for (test::DeviceBuffer<uint8_t>& b : blocks) {
    ASSERT_EQ(cudaMemsetAsync(b.get(), 0, b.bytes(), stream.get()), cudaSuccess);
  }
  (void)l.layer.forward(forward, stream.get());
  stream.sync();
  const std::vector<RankOutputs> zeroed = l.buffers.download();
  EXPECT_NE(zeroed[0].y, own[0].y) << "the layer quantized the weights again over the block it was given";
}

// `setup`: the captured layer's (the eager steps it is held to run the default's).
void expect_graph_replays_give_the_eager_bits(const LayerCase& c, const LayerSetup& setup = {}) {
  const SeededStep s(c, RoutingCase::kZipf);
  LoopbackLayer l(c, s.weights, setup);
  const Stream stream;
  l.buffers.prepare(s.step, l.world);
  ASSERT_NO_THROW(run_step(l.layer, l.buffers, stream));  // an eager step first: every kernel's module loaded
  std::unique_ptr<test::CapturedGraph> graph;
  try {
    graph = std::make_unique<test::CapturedGraph>(stream, [&](cudaStream_t captured) {
      const MoEContext context = l.layer.forward(l.buffers.forward_args(), captured);
      l.layer.backward(l.buffers.backward_args(), context, captured);
    });
  } catch (const Error& e) {
    FAIL() << "capture failed: " << e.what();
  }
  for (RoutingCase routing : {RoutingCase::kUniform, RoutingCase::kAllToOne, RoutingCase::kEmptySlots}) {
    const TracedSeed seed(std::string(exchange_test::name_of(routing)) + ", ");
    const HostStep step = random_step(c, routing, seed.value());
    l.buffers.prepare(step, l.world);
    graph->launch(stream);
    stream.sync();
    ASSERT_NO_THROW(l.layer.check());
    expect_same_bits(run_once(c, s.weights, step), l.buffers.download(),
                     std::string("a replay, ") + exchange_test::name_of(routing));
  }
}

// One CUDA graph of forward + backward (the weights quantized inside it, as at every call without
// MoEWeights::w_fp8) replayed with new routing and inputs: each replay the bits of an eager step of
// a fresh layer.
TEST(GpuMoELayerFp8Steps, GraphReplaysGiveTheEagerBits) {
  CARACAL_REQUIRE_GPU();
  for (const LayerCase& c : {kRepeatCase, kRepeatCaseW1}) {
    SCOPED_TRACE(c.name);
    ASSERT_NO_FATAL_FAILURE(expect_graph_replays_give_the_eager_bits(c));
  }
}

// The FP8 forward in one launch (layer::LayerExperiments::fused_fp8_forward: the shared and routed
// experts' FP8 GEMMs from one task counter, x's e4m3 rows gathered at home or pulled, one
// macrobatch, combine from expert_dy after it) gives the separate launches' bits, forward and
// backward; with every row pulled too (pull_all_rows: the comm role's e4m3 pulls and the ring's
// waits run at W = 1). The world sizes its kernel parameters hold (fused::kFusedFp8MaxLocalRanks).
TEST(GpuMoELayerFp8Steps, FusedForwardGivesTheSeparateLaunchesBits) {
  CARACAL_REQUIRE_GPU();
  const std::vector<LayerCase> cases = fp8_cases();
  for (const LayerCase& c : {kRepeatCaseW1, kRepeatCase, cases[0], cases[2], cases[3]}) {
    for (const bool pull_all_rows : {false, true}) {
      SCOPED_TRACE(c.name + (pull_all_rows ? ", every row pulled" : ""));
      const SeededStep s(c, c.routing);
      LayerSetup fused;
      fused.experiments.fused_fp8_forward = true;
      fused.experiments.pull_all_rows = pull_all_rows;
      expect_same_bits(run_once(c, s), run_once(c, s, fused), "the fused FP8 forward against the separate launches");
    }
  }
}

// The FP8 backward's dgrad and dx in one launch (layer::LayerExperiments::fused_fp8_backward: the
// shared and routed experts' FP8 dgrad and dx tiles from one task counter over dy pulled before it,
// the routed dx rows stored into their home slots) gives the separate launches' bits, alone and after
// the fused FP8 forward, on every world size its kernel parameters hold (D = 256: below the wide
// dgrad's D, where dg's partials would sum otherwise: fused/fused_backward.hpp).
TEST(GpuMoELayerFp8Steps, FusedBackwardGivesTheSeparateLaunchesBits) {
  CARACAL_REQUIRE_GPU();
  const std::vector<LayerCase> cases = fp8_cases();
  // T a multiple of 128: the shared expert reads its rows in place.
  const LayerCase shared_in_place{"W2_shared_in_place_k2", 2, 128, 8, 2, true, false, kNormalized,
                                  RoutingCase::kZipf, Precision::kFP8};
  for (const LayerCase& c : {kRepeatCaseW1, kRepeatCase, cases[0], cases[2], cases[3], shared_in_place}) {
    for (const bool fused_forward : {false, true}) {
      SCOPED_TRACE(c.name + (fused_forward ? ", after the fused forward" : ""));
      const SeededStep s(c, c.routing);
      LayerSetup fused;
      fused.experiments.fused_fp8_backward = true;
      fused.experiments.fused_fp8_forward = fused_forward;
      expect_same_bits(run_once(c, s), run_once(c, s, fused), "the fused FP8 backward against the separate launches");
    }
  }
}

// Both fused FP8 passes in one CUDA graph replayed with new routing and inputs: each replay the
// bits of an eager step of the separate launches.
TEST(GpuMoELayerFp8Steps, FusedPassesReplayTheSeparateLaunchesBits) {
  CARACAL_REQUIRE_GPU();
  LayerSetup fused;
  fused.experiments.fused_fp8_forward = true;
  fused.experiments.fused_fp8_backward = true;
  for (const LayerCase& c : {kRepeatCase, kRepeatCaseW1}) {
    SCOPED_TRACE(c.name);
    ASSERT_NO_FATAL_FAILURE(expect_graph_replays_give_the_eager_bits(c, fused));
  }
}

// A world of more local ranks than the fused FP8 backward's kernel parameters hold is refused by
// name at construction.
TEST(GpuMoELayerFp8Steps, FusedBackwardRefusesMoreLocalRanksThanItHolds) {
  CARACAL_REQUIRE_GPU();
  const LayerCase c = fp8_cases()[4];  // W = 8: twice the 4 it holds
  ASSERT_EQ(c.world, 8);
  const SeededStep s(c, c.routing);
  LayerSetup setup;
  setup.experiments.fused_fp8_backward = true;
  try {
    LoopbackLayer l(c, s.weights, setup);
    ADD_FAILURE() << "a world of " << c.world << " local ranks took the fused FP8 backward";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fused FP8 backward drives at most"), std::string::npos) << e.what();
  }
}

// Without FP8 weight gradients the fused FP8 backward is refused by name at construction.
TEST(GpuMoELayerFp8Steps, FusedBackwardNeedsFp8WeightGradients) {
  CARACAL_REQUIRE_GPU();
  const SeededStep s(kRepeatCaseW1, kRepeatCaseW1.routing);
  LayerSetup setup;
  setup.experiments.fused_fp8_backward = true;
  setup.options.fp8_weight_gradients = false;
  try {
    LoopbackLayer l(kRepeatCaseW1, s.weights, setup);
    ADD_FAILURE() << "a layer with bf16 weight gradients took the fused FP8 backward";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fp8_weight_gradients"), std::string::npos) << e.what();
  }
}

// MoEWeights::w_fp8 and quantize_weights belong to FP8 layers: a bf16 layer refuses them by name.
TEST(GpuMoELayerFp8Steps, Bf16LayersRefuseQuantizedWeights) {
  CARACAL_REQUIRE_GPU();
  LayerCase bf16 = kRepeatCase;
  bf16.precision = Precision::kBF16;
  const SeededStep s(bf16, bf16.routing);
  LoopbackLayer l(bf16, s.weights);
  l.buffers.prepare(s.step, l.world);
  const Stream stream;
  test::DeviceBuffer<uint8_t> block;
  ASSERT_NO_FATAL_FAILURE(block.allocate(256));
  EXPECT_THROW((void)l.layer.fp8_weight_bytes(), Error);
  std::vector<MoEForwardArgs> forward = l.buffers.forward_args();
  try {
    l.layer.quantize_weights(forward[0].weights, block.get(), stream.get());
    ADD_FAILURE() << "a bf16 layer quantized weights";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bf16"), std::string::npos) << e.what();
  }
  forward[0].weights.w_fp8 = block.get();
  try {
    (void)l.layer.forward(forward, stream.get());
    ADD_FAILURE() << "a bf16 layer took weights.w_fp8";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("weights.w_fp8"), std::string::npos) << e.what();
  }
}

// The FP8 GEMMs read W_gate_up interleaved: the halves layout is refused by name, not misread.
TEST(GpuMoELayerFp8Steps, RefusesTheHalvesLayout) {
  CARACAL_REQUIRE_GPU();
  const SeededStep s(kRepeatCase, kRepeatCase.routing);
  LayerSetup setup;
  setup.gate_up_layout = gemm::GateUpLayout::kHalves;
  LoopbackLayer l(kRepeatCase, s.weights, setup);
  l.buffers.prepare(s.step, l.world);
  const Stream stream;
  try {
    (void)l.layer.forward(l.buffers.forward_args(), stream.get());
    ADD_FAILURE() << "an FP8 layer took W_gate_up in halves";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("w_gate_up_layout"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace caracal::layer_test
