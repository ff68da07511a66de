// MoELayer (caracal/moe_layer.hpp) on the GPU: y and every gradient against the fp64 reference in
// bf16-rounding mode (relative Frobenius <= 1e-2 per output; d_topk_scores per element with an
// absolute part scaled by the size of the token's dg terms), outputs poisoned with NaN first.
//   * loopback W = 1, 2, 4, 8, NCCL W = 1 and (with that many GPUs) NCCL W = 2, 4, 8 one thread per
//     GPU, with and without the shared expert (and its per-token
//     scale), normalization on and off, on random, Zipf and adversarial routings (all routes of
//     all ranks to one expert, empty experts and ranks, all slots empty, repeated experts, -1 slots);
//   * the worst case: all W*T*k routes of W = 8 ranks to one expert, nothing dropped;
//   * one CUDA graph of forward+backward replayed with new routing and inputs each time;
//   * bitwise-identical outputs across runs, grouped-GEMM CTA counts and the zero-copy path;
//   * argument errors, stale contexts and out-of-range expert ids raised at check().
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "caracal/comm/loopback_world.hpp"
#include "caracal/comm/nccl_bootstrap.hpp"
#include "caracal/comm/nccl_world.hpp"
#include "caracal/error.hpp"
#include "caracal/gemm/grouped_gemm.hpp"
#include "caracal/moe_layer.hpp"
#include "error_checks.hpp"
#include "exchange_test_support.hpp"
#include "gpu_test_util.hpp"
#include "moe_layer_test_support.hpp"

namespace caracal::layer_test {
namespace {

using test::expect_error;

void check_loopback(const LayerCase& c) {
  const HostWeights weights = random_weights(c, fresh_seed());
  LoopbackLayer l(c, weights);
  check_step(c, l.layer, l.buffers, weights, c.routing);
}

// ---- Loopback sweep ----------------------------------------------------------------------------------

// The backward of `context` once more over `l`'s buffers, their outputs poisoned first: every
// rank's outputs, with y (which backward does not write) taken from `with_y`.
std::vector<RankOutputs> backward_again(LoopbackLayer& l, const MoEContext& context,
                                        const std::vector<RankOutputs>& with_y, const Stream& stream) {
  for (const RankBuffers& r : l.buffers.ranks) r.poison_outputs();
  exchange_test::settle();
  l.layer.backward(l.buffers.backward_args(), context, stream.get());
  stream.sync();
  EXPECT_NO_THROW(l.layer.check());
  std::vector<RankOutputs> again = l.buffers.download();
  for (size_t r = 0; r < again.size(); ++r) again[r].y = with_y[r].y;
  return again;
}

std::vector<LayerCase> loopback_cases() {
  using R = RoutingCase;
  return {
      {"W1_uniform_shared_k2", 1, 133, 8, 2, true, false, kNormalized, R::kUniform},
      {"W1_zipf_noshared_k4_unnormalized", 1, 101, 8, 4, false, false, kUnnormalized, R::kZipf},
      {"W2_empty_slots_shared_scale_k3", 2, 75, 8, 3, true, true, kNormalized, R::kEmptySlots},
      {"W2_duplicates_noshared_k4", 2, 97, 8, 4, false, false, kNormalizedScaled, R::kDuplicates},
      {"W4_all_to_one_shared_k4", 4, 61, 16, 4, true, false, kNormalized, R::kAllToOne},
      {"W4_empty_ranks_shared_scale_k2_unnormalized", 4, 53, 16, 2, true, true, kUnnormalized, R::kEmptyRanks},
      {"W4_zipf_shared_k3", 4, 45, 8, 3, true, false, kNormalizedScaled, R::kZipf},
      {"W8_uniform_shared_scale_k4", 8, 37, 16, 4, true, true, kNormalized, R::kUniform},
      {"W8_all_slots_empty_shared_k2", 8, 41, 8, 2, true, false, kNormalized, R::kAllEmpty},
      {"W8_zipf_noshared_k2_unnormalized", 8, 39, 16, 2, false, false, kUnnormalized, R::kZipf},
      {"W8_empty_slots_shared_k3", 8, 37, 8, 3, true, false, kNormalizedScaled, R::kEmptySlots},
  };
}

class GpuMoELayer : public testing::TestWithParam<LayerCase> {};

TEST_P(GpuMoELayer, MatchesReference) {
  CARACAL_REQUIRE_GPU();
  check_loopback(GetParam());
}

INSTANTIATE_TEST_SUITE_P(Loopback, GpuMoELayer, testing::ValuesIn(loopback_cases()), case_name);

TEST(GpuMoELayerImbalance, AllRoutesOfEightRanksToOneExpertDropNothing) {
  CARACAL_REQUIRE_GPU();
  // 8 * 133 * 4 = 4256 routes, all on the last rank's last expert.
  check_loopback({"W8_all_to_one_worst_case", 8, 133, 16, 4, true, true, kNormalized, RoutingCase::kAllToOne});
}

// ---- NCCL ---------------------------------------------------------------------------------------------

TEST(GpuMoELayerNccl, SingleRankMatchesReference) {
  CARACAL_REQUIRE_GPU();
  const LayerCase c{"nccl_W1_shared_scale_k4", 1, 133, 8, 4, true, true, kNormalizedScaled, RoutingCase::kZipf};
  const HostWeights weights = random_weights(c, fresh_seed());
  std::vector<comm::NcclComm> comms = comm::init_all({0});
  MoELayerOptions ring;
  ring.ring_rows = 128;  // 532 routes: five macrobatches, walked by both passes
  comm::NcclWorld world(comms[0].get(), MoELayer::heap_bytes(config_of(c)) + MoELayer::heap_bytes(config_of(c), ring));
  MoELayer layer(config_of(c), world);
  const WorldBuffers buffers(c, weights, world);
  check_step(c, layer, buffers, weights, RoutingCase::kZipf);
  check_step(c, layer, buffers, weights, RoutingCase::kEmptySlots);  // every buffer reused
  MoELayer ring_layer(config_of(c), world, ring);
  check_step(c, ring_layer, buffers, weights, RoutingCase::kZipf);
}

const LayerCase kMismatchCase{"mismatch_W2", 2, 64, 8, 2, true, false, kNormalized, RoutingCase::kUniform};

// One rank per GPU, one host thread each (the tools' mode; W GPUs over NVLink): every rank's outputs
// and gradients against the reference of the whole world, on Zipf, -1-slot and all-to-one routings,
// then the Zipf step again, bitwise. Skipped where fewer than W GPUs exist.
class GpuMoELayerNcclThreads : public testing::TestWithParam<int> {};

// One step on every GPU's rank (a layer built with `options`); returns each rank's outputs (rank
// order) or the first failure.
std::vector<RankOutputs> run_threads(const LayerCase& c, const HostWeights& weights, const HostStep& step,
                                     const MoELayerOptions& options = {}) {
  std::vector<int> devices(static_cast<size_t>(c.world));
  for (int d = 0; d < c.world; ++d) devices[static_cast<size_t>(d)] = d;
  std::vector<comm::NcclComm> comms = comm::init_all(devices);
  std::vector<RankOutputs> outputs(devices.size());
  const std::vector<std::string> failures = test::on_each_gpu(c.world, [&](int rank) {
    const size_t r = static_cast<size_t>(rank);
    comm::NcclWorld world(comms[r].get(), MoELayer::heap_bytes(config_of(c), options));  // collective
    MoELayer layer(config_of(c), world, options);
    const WorldBuffers buffers(c, weights, world);
    buffers.prepare(step, world);
    Stream stream;
    run_step(layer, buffers, stream);
    outputs[r] = buffers.download()[0];
  });
  for (size_t r = 0; r < failures.size(); ++r) {
    if (!failures[r].empty()) throw Error("rank " + std::to_string(r) + ": " + failures[r]);
  }
  return outputs;
}

TEST_P(GpuMoELayerNcclThreads, MatchReferenceAndRepeatBitwise) {
  const int world = GetParam();
  CARACAL_REQUIRE_GPUS(world);
  const LayerCase c{"nccl_threads", world, 133, 4 * world, 4, true, true, kNormalizedScaled, RoutingCase::kZipf};
  const HostWeights weights = random_weights(c, fresh_seed());
  const ReferenceLayer reference = reference_layer(c, weights);
  std::vector<RankOutputs> first;
  for (RoutingCase routing : {RoutingCase::kZipf, RoutingCase::kEmptySlots, RoutingCase::kAllToOne}) {
    const TracedSeed seed(std::string(exchange_test::name_of(routing)) + ", ");
    const HostStep step = random_step(c, routing, seed.value());
    std::vector<RankOutputs> got;
    ASSERT_NO_THROW(got = run_threads(c, weights, step));
    expect_step_matches(c, step, reference_for(c, weights, step), got);
    if (routing == RoutingCase::kZipf) {
      std::vector<RankOutputs> again;
      ASSERT_NO_THROW(again = run_threads(c, weights, step));
      expect_same_bits(got, again, "a second run");
    }
    // A ring of 128 rows: both passes in macrobatches, the backward's first one reusing the x rows
    // the forward pulled over NVLink (RowsInPlace), the same gradient bits (y's groups follow the
    // macrobatches: within the reference's bounds).
    MoELayerOptions ring;
    ring.ring_rows = 128;
    std::vector<RankOutputs> on_ring;
    ASSERT_NO_THROW(on_ring = run_threads(c, weights, step, ring));
    expect_same_bits_but_y(got, on_ring, "a ring of 128 rows", /*dx_aside=*/true);
    expect_step_matches(c, step, reference_for(c, weights, step, ring), on_ring);
  }
}

// Ranks built with different configurations would lay out their heaps differently: every rank
// refuses at construction, naming the field and each rank's value.
TEST(GpuMoELayerNccl, MismatchedRanksAreRefusedOnEveryRank) {
  CARACAL_REQUIRE_GPUS(2);
  LayerConfig configs[2] = {config_of(kMismatchCase), config_of(kMismatchCase)};
  configs[1].shape.top_k = 3;
  const size_t heap = std::max(MoELayer::heap_bytes(configs[0]), MoELayer::heap_bytes(configs[1]));
  std::vector<comm::NcclComm> comms = comm::init_all({0, 1});
  const std::vector<std::string> messages = test::on_each_gpu(2, [&](int r) {
    comm::NcclWorld world(comms[static_cast<size_t>(r)].get(), heap);  // same heap: the layer must notice
    MoELayer layer(configs[r], world);
  });
  for (const std::string& m : messages) {
    EXPECT_NE(m.find("MoELayer: the ranks of this world were built differently"), std::string::npos) << m;
    EXPECT_NE(m.find("top_k differs (rank 0: 2, rank 1: 3)"), std::string::npos) << m;
  }
}

// ... and so would ranks built with options that lay out the heap differently: here one rank on
// v1's path, so with buffers of every row and without the fused path's ring of dx rows.
TEST(GpuMoELayerNccl, RanksWithDifferentHeapOptionsAreRefusedOnEveryRank) {
  CARACAL_REQUIRE_GPUS(2);
  const LayerConfig config = config_of(kMismatchCase);
  MoELayerOptions options[2];
  options[1].fused_forward = false;
  const size_t heap = std::max(MoELayer::heap_bytes(config, options[0]), MoELayer::heap_bytes(config, options[1]));
  std::vector<comm::NcclComm> comms = comm::init_all({0, 1});
  const std::vector<std::string> messages = test::on_each_gpu(2, [&](int r) {
    comm::NcclWorld world(comms[static_cast<size_t>(r)].get(), heap);
    MoELayer layer(config, world, options[r]);
  });
  for (const std::string& m : messages) {
    EXPECT_NE(m.find("MoELayer: the ranks of this world were built differently"), std::string::npos) << m;
    EXPECT_NE(m.find("fused_forward (as run: false past 8 ranks) differs (rank 0: 1, rank 1: 0)"),
              std::string::npos)
        << m;
  }
}

INSTANTIATE_TEST_SUITE_P(W, GpuMoELayerNcclThreads, testing::Values(2, 4, 8),
                         [](const testing::TestParamInfo<int>& param) { return "W" + std::to_string(param.param); });

// ---- CUDA graph ---------------------------------------------------------------------------------------

// On the default ring (one macrobatch here) and on a ring of 128 rows, so that the replays' routings
// walk from one macrobatch (uniform) to several (all to one) through the same graph.
TEST(GpuMoELayerGraph, ReplaysForwardBackwardWithNewRoutingAndInputs) {
  CARACAL_REQUIRE_GPU();
  const LayerCase c{"graph_W4", 4, 53, 16, 3, true, true, kNormalizedScaled, RoutingCase::kUniform};
  const HostWeights weights = random_weights(c, fresh_seed());
  for (const int ring_rows : {0, 128}) {
    SCOPED_TRACE("ring_rows " + std::to_string(ring_rows));
    MoELayerOptions options;
    options.ring_rows = ring_rows;
    comm::LoopbackWorld world(c.world, MoELayer::heap_bytes(config_of(c), options));
    MoELayer layer(config_of(c), world, options);
    const WorldBuffers buffers(c, weights, world);
    // One eager step first, as frameworks warm up before capturing: it loads every kernel's module.
    check_step(c, layer, buffers, weights, RoutingCase::kZipf);
    Stream stream;

    std::unique_ptr<test::CapturedGraph> graph;
    try {
      graph = std::make_unique<test::CapturedGraph>(stream, [&](cudaStream_t s) {
        const MoEContext context = layer.forward(buffers.forward_args(), s);
        layer.backward(buffers.backward_args(), context, s);
      });
    } catch (const Error& e) {
      FAIL() << "capture failed: " << e.what();
    }

    const RoutingCase replays[] = {RoutingCase::kUniform, RoutingCase::kAllToOne, RoutingCase::kEmptySlots,
                                   RoutingCase::kZipf};
    for (RoutingCase routing : replays) {
      const TracedSeed seed(std::string(exchange_test::name_of(routing)) + ", ");
      const HostStep step = random_step(c, routing, seed.value());
      buffers.prepare(step, world);
      graph->launch(stream);
      stream.sync();
      ASSERT_NO_THROW(layer.check());
      expect_step_matches(c, step,
                          reference_step(c, reference_layer(c, weights), step, layer.ring_rows(), false,
                                         layer.groups_dx_rows()),
                          buffers.download());
    }
  }
}

// ---- Determinism -------------------------------------------------------------------------------------

// The zero-copy path: inputs written straight into the layer's buffers, y / dx / d_topk_scores read
// from there.
std::vector<RankOutputs> run_zero_copy(MoELayer& layer, const WorldBuffers& buffers, const HostStep& step) {
  std::vector<MoEForwardArgs> forward = buffers.forward_args();
  std::vector<MoEBackwardArgs> backward = buffers.backward_args();
  for (size_t l = 0; l < buffers.ranks.size(); ++l) {
    const MoELayerBuffers own = layer.buffers(static_cast<int>(l));
    const size_t rows = step.x[l].size(), routes = step.scores[l].size();
    check_cuda(cudaMemset(own.y, exchange_test::kNanByte, rows * 2), "cudaMemset(poison y)");
    check_cuda(cudaMemset(own.dx, exchange_test::kNanByte, rows * 2), "cudaMemset(poison dx)");
    check_cuda(cudaMemset(own.d_topk_scores, exchange_test::kNanByte, routes * 4), "cudaMemset(poison d_topk_scores)");
    const int32_t* ids = step.routing.rank_topk(static_cast<int64_t>(l));
    const std::vector<int32_t> idx(ids, ids + routes);
    check_cuda(cudaMemcpy(own.x, step.x[l].data(), rows * 2, cudaMemcpyHostToDevice), "cudaMemcpy(x)");
    check_cuda(cudaMemcpy(own.dy, step.dy[l].data(), rows * 2, cudaMemcpyHostToDevice), "cudaMemcpy(dy)");
    check_cuda(cudaMemcpy(own.topk_idx, idx.data(), routes * 4, cudaMemcpyHostToDevice), "cudaMemcpy(topk_idx)");
    check_cuda(cudaMemcpy(own.topk_scores, step.scores[l].data(), routes * 4, cudaMemcpyHostToDevice),
               "cudaMemcpy(topk_scores)");
    forward[l].x = own.x;
    forward[l].topk_idx = own.topk_idx;
    forward[l].topk_scores = own.topk_scores;
    forward[l].y = own.y;
    backward[l].dy = own.dy;
    backward[l].dx = own.dx;
    backward[l].d_topk_scores = own.d_topk_scores;
  }
  exchange_test::settle();
  Stream stream;
  const MoEContext context = layer.forward(forward, stream.get());
  layer.backward(backward, context, stream.get());
  stream.sync();
  layer.check();
  std::vector<RankOutputs> out = buffers.download();  // weight gradients and d_shared_scale
  for (size_t l = 0; l < out.size(); ++l) {
    const MoELayerBuffers own = layer.buffers(static_cast<int>(l));
    const size_t rows = step.x[l].size();
    out[l].y.assign(rows, 0);
    out[l].dx.assign(rows, 0);
    out[l].d_scores.assign(step.scores[l].size(), 0.0f);
    check_cuda(cudaMemcpy(out[l].y.data(), own.y, rows * 2, cudaMemcpyDeviceToHost), "cudaMemcpy(y)");
    check_cuda(cudaMemcpy(out[l].dx.data(), own.dx, rows * 2, cudaMemcpyDeviceToHost), "cudaMemcpy(dx)");
    check_cuda(cudaMemcpy(out[l].d_scores.data(), own.d_topk_scores, out[l].d_scores.size() * 4,
                          cudaMemcpyDeviceToHost),
               "cudaMemcpy(d_topk_scores)");
  }
  return out;
}

TEST(GpuMoELayerDeterminism, BitwiseAcrossRunsCtaCountsAndTheZeroCopyPath) {
  CARACAL_REQUIRE_GPU();
  const LayerCase c{"determinism_W4", 4, 61, 16, 4, true, true, kNormalized, RoutingCase::kZipf};
  const SeededStep s(c, RoutingCase::kZipf);
  const size_t heap = MoELayer::heap_bytes(config_of(c));
  comm::LoopbackWorld world(c.world, heap);
  comm::LoopbackWorld other_world(c.world, heap);
  MoELayer layer(config_of(c), world);
  MoELayerOptions few_ctas;
  few_ctas.gemm_ctas = 7;
  MoELayer other_layer(config_of(c), other_world, few_ctas);
  // More CTAs than a tile queue serves: the row tiles at a fixed stride instead.
  MoELayerOptions fixed_stride;
  fixed_stride.gemm_ctas = gemm::kTileQueueMaxCtas + 1;
  comm::LoopbackWorld fixed_stride_world(c.world, heap);
  MoELayer fixed_stride_layer(config_of(c), fixed_stride_world, fixed_stride);
  const WorldBuffers buffers(c, s.weights, world);
  Stream stream;

  const auto run = [&](MoELayer& l) {
    buffers.prepare(s.step, l.world());
    run_step(l, buffers, stream);
    return buffers.download();
  };
  const std::vector<RankOutputs> first = run(layer);
  expect_step_matches(c, s.step, reference_for(c, s.weights, s.step), first);
  expect_same_bits(first, run(layer), "second run");
  expect_same_bits(first, run(other_layer), "gemm_ctas = 7");
  expect_same_bits(first, run(fixed_stride_layer), "row tiles at a fixed stride (no tile queue)");
  // On a ring of 128 rows (both passes in macrobatches, weight gradients carried across them) with
  // 7 and with all CTAs.
  MoELayerOptions ring;
  ring.ring_rows = 128;
  comm::LoopbackWorld ring_world(c.world, 2 * MoELayer::heap_bytes(config_of(c), ring));
  MoELayer ring_layer(config_of(c), ring_world, ring);
  ring.gemm_ctas = 7;
  MoELayer ring_few_ctas(config_of(c), ring_world, ring);
  // y's groups follow the macrobatches (group_sum.cuh): the gradients v1's bits, y the reference's.
  const std::vector<RankOutputs> on_ring = run(ring_layer);
  expect_same_bits_but_y(first, on_ring, "a ring of 128 rows", ring_layer.groups_dx_rows());
  expect_step_matches(c, s.step,
                      reference_step(c, reference_layer(c, s.weights), s.step, ring_layer.ring_rows(), false,
                                     ring_layer.groups_dx_rows()),
                      on_ring);
  expect_same_bits(on_ring, run(ring_few_ctas), "a ring of 128 rows, gemm_ctas = 7");
  buffers.prepare(s.step, world);  // poisons the weight gradients, which the zero-copy run writes there too
  expect_same_bits(first, run_zero_copy(layer, buffers, s.step), "zero-copy path");
}

// The routed experts' W_gate_up as Hugging Face's [gate; up] halves (MoEWeights::w_gate_up_layout),
// read and written in place: every output bitwise the interleaved layer's, d_w_gate_up its rows in
// the halves' order; on v1, the fused path, and the fused path over a ring of 128 rows
// (macrobatches, the backward's replayed up/gate tiles, weight gradients continued across them); at
// W = 2 and at W = 1 (where the weight-gradient kernel runs the dx sums on its idle warps).
TEST(GpuMoELayerLayout, HalvesGiveTheInterleavedBits) {
  CARACAL_REQUIRE_GPU();
  for (const LayerCase& c : {LayerCase{"layout_W2", 2, 77, 8, 3, true, true, kNormalizedScaled, RoutingCase::kZipf},
                             LayerCase{"layout_W1", 1, 150, 8, 4, true, false, kNormalized, RoutingCase::kZipf}}) {
    const SeededStep s(c, RoutingCase::kZipf);
    const size_t L = static_cast<size_t>(c.experts / c.world), I = kIntermediate, D = kHidden;
    const std::pair<const char*, LayerSetup> setups[] = {
        {"v1", v1_setup()}, {"fused", fused_setup()}, {"fused, a ring of 128 rows", fused_setup(0, 128)}};
    for (auto [name, setup] : setups) {
      SCOPED_TRACE(c.name + ", " + name);
      const std::vector<RankOutputs> interleaved = run_once(c, s, setup);
      setup.gate_up_layout = gemm::GateUpLayout::kHalves;
      std::vector<RankOutputs> halves = run_once(c, s, setup);
      for (RankOutputs& r : halves) {  // back to the interleaved order, to compare
        std::vector<float> rows(r.d_w_gate_up.size());
        for (size_t e = 0; e < L; ++e) {
          for (size_t j = 0; j < I; ++j) {
            for (const bool up : {false, true}) {
              const size_t from = (e * 2 * I + (up ? I : 0) + j) * D;
              const size_t to = (e * 2 * I + static_cast<size_t>(gemm::gate_up_row(static_cast<int64_t>(j), up))) * D;
              std::copy_n(r.d_w_gate_up.begin() + static_cast<int64_t>(from), D,
                          rows.begin() + static_cast<int64_t>(to));
            }
          }
        }
        r.d_w_gate_up = std::move(rows);
      }
      expect_same_bits(interleaved, halves, std::string(name) + ", W_gate_up in halves");
    }
  }
}

// ---- The checks themselves ------------------------------------------------------------------------

bool any_names(const std::vector<std::string>& failures, const std::string& part) {
  for (const std::string& f : failures) {
    if (f.find(part) != std::string::npos) return true;
  }
  return false;
}

// The bounds are tight enough to catch small systematic errors, on fresh inputs every run: one
// expert computing 0.5% too much (its gate/up weight gradients, which the checks see per expert;
// y itself, a bf16 sum of bf16 rows, resolves about 1%: an expert 5% off), a dropped token, one
// expert's weight gradient 0.5% off, one score gradient 5% off.
TEST(GpuMoELayerChecks, CatchDeliberateErrors) {
  CARACAL_REQUIRE_GPU();
  const LayerCase c{"checks_W2", 2, 97, 8, 2, true, true, kNormalized, RoutingCase::kUniform};
  const SeededStep s(c, RoutingCase::kUniform);
  const HostStep& step = s.step;
  const std::vector<RankOutputs> got = run_once(c, s.weights, step);
  const ReferenceLayer reference = reference_layer(c, s.weights);
  const StepExpected want = reference_step(c, reference, step, 0, false, /*dx_groups=*/true);
  ASSERT_EQ(step_failures(c, step, want, got), std::vector<std::string>{}) << "the real outputs pass";

  // Expert 5 (rank 1's second) computes too much: its output rows, and through W_down^T dy its
  // gate/up gradients, are off.
  const auto expert_scaled = [&](double factor) {
    ReferenceLayer scaled = reference;
    for (double& w : scaled.experts[5].down) w *= factor;
    return step_failures(c, step, reference_step(c, scaled, step, 0, false, /*dx_groups=*/true), got, false);
  };
  const std::vector<std::string> half_percent = expert_scaled(1.005);
  EXPECT_TRUE(any_names(half_percent, "rank 1 d_w_gate")) << "d_w_gate missed an expert 0.5% off";
  EXPECT_TRUE(any_names(half_percent, "rank 1 d_w_up")) << "d_w_up missed an expert 0.5% off";
  EXPECT_TRUE(any_names(expert_scaled(1.05), " y:")) << "y missed an expert 5% off";

  // One token's y and another's dx never written back (a dropped row), on one rank.
  std::vector<RankOutputs> dropped = got;
  std::fill(dropped[1].y.begin() + 5 * kHidden, dropped[1].y.begin() + 6 * kHidden, uint16_t{0});
  std::fill(dropped[0].dx.begin() + 11 * kHidden, dropped[0].dx.begin() + 12 * kHidden, uint16_t{0});
  const std::vector<std::string> row_off = step_failures(c, step, want, dropped, false);
  EXPECT_TRUE(any_names(row_off, "rank 1 y:")) << "y missed a dropped token";
  EXPECT_TRUE(any_names(row_off, "rank 0 dx:")) << "dx missed a dropped token";

  // One expert's down-projection gradient 0.5% off.
  std::vector<RankOutputs> grad_off = got;
  const size_t block = static_cast<size_t>(kHidden) * kIntermediate;
  for (size_t i = block; i < 2 * block; ++i) grad_off[0].d_w_down[i] *= 1.005f;
  EXPECT_TRUE(any_names(step_failures(c, step, want, grad_off, false), "rank 0 d_w_down")) << "d_w_down missed 0.5%";

  // The largest score gradient of rank 1, 5% off.
  std::vector<RankOutputs> score_off = got;
  std::vector<float>& scores = score_off[1].d_scores;
  const size_t largest = static_cast<size_t>(
      std::max_element(scores.begin(), scores.end(), [](float a, float b) { return std::abs(a) < std::abs(b); }) -
      scores.begin());
  scores[largest] *= 1.05f;
  EXPECT_TRUE(any_names(step_failures(c, step, want, score_off, false), "d_topk_scores"))
      << "d_topk_scores missed 5%";
}

// ---- API misuse ----------------------------------------------------------------------------------------

const LayerCase kApiCase{"api_W2", 2, 37, 8, 2, true, false, kNormalized, RoutingCase::kUniform};

// A loopback layer of `c` whose buffers hold one uniform step's inputs, weights and inputs from
// fixed seeds (these tests check refusals, not numbers).
std::unique_ptr<LoopbackLayer> prepared_layer(const LayerCase& c, uint64_t seed) {
  auto l = std::make_unique<LoopbackLayer>(c, random_weights(c, seed));
  l->buffers.prepare(random_step(c, RoutingCase::kUniform, seed + 5), l->world);
  return l;
}

TEST(GpuMoELayerApi, ForwardAndBackwardRejectBadArguments) {
  CARACAL_REQUIRE_GPU();
  const LayerCase& c = kApiCase;
  const auto l = prepared_layer(c, 1);
  auto& [world, owned_layer, layer, buffers] = *l;
  Stream stream;
  const cudaStream_t s = stream.get();

  expect_error([&] { layer.forward(buffers.forward_args()[0], s); }, {"one argument struct per local rank (2), got 1"});
  std::vector<MoEForwardArgs> forward = buffers.forward_args();
  forward[1].x = nullptr;
  expect_error([&] { layer.forward(forward, s); }, {"MoELayer::forward: ranks[1].x", "[T=37][D=256] bf16", "got null"});
  forward = buffers.forward_args();
  forward[0].y = forward[0].y + 1;
  expect_error([&] { layer.forward(forward, s); }, {"ranks[0].y must be 16-byte aligned"});
  forward = buffers.forward_args();
  forward[0].weights.w_down = nullptr;
  expect_error([&] { layer.forward(forward, s); }, {"ranks[0].weights.w_down", "[L=4][D=256][I=128] bf16"});
  forward = buffers.forward_args();
  forward[1].weights.shared_w_gate_up = nullptr;
  expect_error([&] { layer.forward(forward, s); }, {"ranks[1].weights.shared_w_gate_up", "got null"});
  std::vector<uint16_t> host_rows(static_cast<size_t>(c.tokens) * kHidden);
  forward = buffers.forward_args();
  forward[0].x = reinterpret_cast<const __nv_bfloat16*>(host_rows.data());
  expect_error([&] { layer.forward(forward, s); }, {"ranks[0].x must point to device memory"});

  const MoEContext context = layer.forward(buffers.forward_args(), s);
  std::vector<MoEBackwardArgs> backward = buffers.backward_args();
  backward[1].d_topk_scores = nullptr;
  expect_error([&] { layer.backward(backward, context, s); },
               {"MoELayer::backward: ranks[1].d_topk_scores", "got null"});
  backward = buffers.backward_args();
  float stray = 0.0f;
  backward[0].d_shared_scale = &stray;
  expect_error([&] { layer.backward(backward, context, s); },
               {"ranks[0].d_shared_scale must be null: the forward was given no shared_scale"});
  backward = buffers.backward_args();
  backward[1].d_w_down_bf16 = reinterpret_cast<__nv_bfloat16*>(backward[1].d_w_down);
  expect_error([&] { layer.backward(backward, context, s); },
               {"ranks[1].d_w_down_bf16 must be null: d_w_down is given too (pass exactly one of the two)"});
  backward = buffers.backward_args();
  backward[0].d_w_gate_up = nullptr;
  expect_error([&] { layer.backward(backward, context, s); },
               {"ranks[0].d_w_gate_up", "fp32 (or d_w_gate_up_bf16: bf16)", "got null"});
  expect_error([&] { layer.backward(buffers.backward_args(), MoEContext{}, s); },
               {"since its last reset()", "got an empty context"});

  // Nothing was enqueued by the refused calls: the layer still runs a step.
  EXPECT_NO_THROW(layer.backward(buffers.backward_args(), context, s));
  stream.sync();
  EXPECT_NO_THROW(layer.check());
}

// A layer built for fp32 weight gradients only has no partial sums to carry bf16 ones across its
// ring's macrobatches: its backward refuses them, naming the option; fp32 ones run.
TEST(GpuMoELayerApi, Bf16WeightGradientsNeedTheOption) {
  CARACAL_REQUIRE_GPU();
  const LayerCase c{"fp32_grads_only_W2", 2, 200, 8, 4, true, false, kNormalized, RoutingCase::kAllToOne};
  const SeededStep s(c, c.routing);
  MoELayerOptions options;
  options.ring_rows = 128;
  options.bf16_weight_gradients = false;
  LoopbackLayer l(c, s.weights, options);
  l.buffers.prepare(s.step, l.world);
  Stream stream;
  const MoEContext context = l.layer.forward(l.buffers.forward_args(), stream.get());
  std::vector<MoEBackwardArgs> backward = l.buffers.backward_args();
  backward[1].d_w_down_bf16 = reinterpret_cast<__nv_bfloat16*>(backward[1].d_w_down);
  backward[1].d_w_down = nullptr;
  test::expect_error([&] { l.layer.backward(backward, context, stream.get()); },
                     {"MoELayer::backward: ranks[1] asks for bf16 routed weight gradients",
                      "MoELayerOptions::bf16_weight_gradients = false"});
  l.layer.backward(l.buffers.backward_args(), context, stream.get());
  stream.sync();
  ASSERT_NO_THROW(l.layer.check());
  expect_step_matches(c, s.step,
                      reference_step(c, reference_layer(c, s.weights), s.step, l.layer.ring_rows(), false,
                                     l.layer.groups_dx_rows()),
                      l.buffers.download());
}

TEST(GpuMoELayerApi, ContextsOfThisLayerSinceItsLastResetOnly) {
  CARACAL_REQUIRE_GPU();
  const auto l = prepared_layer(kApiCase, 2);
  auto& [world, owned_layer, layer, buffers] = *l;
  Stream stream;
  const MoEContext first = layer.forward(buffers.forward_args(), stream.get());
  EXPECT_EQ(first.forward_id(), 1u);
  expect_error([&] { (void)layer.context(0, buffers.forward_args()); }, {"MoELayer::context: forward_id", "in [1, 1]", "got 0"});
  expect_error([&] { (void)layer.context(2, buffers.forward_args()); }, {"got 2"});
  std::vector<MoEForwardArgs> forward = buffers.forward_args();
  forward[1].topk_scores = nullptr;
  expect_error([&] { (void)layer.context(1, forward); }, {"MoELayer::context: ranks[1].topk_scores", "got null"});
  forward = buffers.forward_args();
  forward[0].y = nullptr;  // a rebuilt context needs the inputs and weights only
  EXPECT_EQ(layer.context(1, forward).forward_id(), 1u);
  layer.reset(stream.get());
  expect_error([&] { layer.backward(buffers.backward_args(), first, stream.get()); },
               {"since its last reset()", "got forward 1"});
  expect_error([&] { (void)layer.context(1, buffers.forward_args()); }, {"forward_id"});
  EXPECT_NO_THROW(layer.backward(buffers.backward_args(), layer.forward(buffers.forward_args(), stream.get()), stream.get()));
  stream.sync();
}

// ---- Several pending forwards ------------------------------------------------------------------------

// Two forwards of different routings, then their backwards (each replaying its forward, since the
// other one ran last), then the first backward once more from a rebuilt context: every output
// bitwise as when each step runs alone.
TEST(GpuMoELayerPending, BackwardOfAnEarlierForwardReplaysItBitwise) {
  CARACAL_REQUIRE_GPU();
  for (const bool fused : {true, false}) {
    SCOPED_TRACE(fused ? "fused forward" : "v1 forward");
    const LayerCase c{"pending_W2", 2, 77, 8, 3, true, true, kNormalizedScaled, RoutingCase::kZipf};
    const SeededStep s(c, RoutingCase::kZipf);
    const HostStep other = random_step(c, RoutingCase::kAllToOne, s.seed.value() + 1);
    MoELayerOptions options;
    options.fused_forward = fused;
    options.ring_rows = 128;  // the all-to-one step's rows over four macrobatches, each replayed
    const auto alone = [&](const HostStep& step) {
      LoopbackLayer single(c, s.weights, options);
      single.buffers.prepare(step, single.world);
      run_step(single.layer, single.buffers, Stream());
      return single.buffers.download();
    };
    const std::vector<RankOutputs> first_alone = alone(s.step), other_alone = alone(other);

    LoopbackLayer l(c, s.weights, options);
    const WorldBuffers other_buffers(c, s.weights, l.world);
    l.buffers.prepare(s.step, l.world);
    other_buffers.prepare(other, l.world);
    Stream stream;
    const MoEContext first = l.layer.forward(l.buffers.forward_args(), stream.get());
    const MoEContext second = l.layer.forward(other_buffers.forward_args(), stream.get());
    l.layer.backward(l.buffers.backward_args(), first, stream.get());
    l.layer.backward(other_buffers.backward_args(), second, stream.get());
    stream.sync();
    ASSERT_NO_THROW(l.layer.check());
    expect_same_bits(first_alone, l.buffers.download(), "first step, replayed");
    expect_same_bits(other_alone, other_buffers.download(), "second step, replayed");

    std::vector<MoEForwardArgs> rebuilt = l.buffers.forward_args();
    for (MoEForwardArgs& a : rebuilt) a.y = nullptr;
    expect_same_bits(first_alone, backward_again(l, l.layer.context(first.forward_id(), rebuilt), first_alone, stream),
                     "first step's backward again, from a rebuilt context");
  }
}

// The backward works in place over the activations it reads, so a second backward of the same
// forward replays it first: the same bits, with the forward's inputs given as copies or read from
// the layer's own buffers (which no later forward rewrote).
TEST(GpuMoELayerPending, SecondBackwardOfOneForwardReplaysItBitwise) {
  CARACAL_REQUIRE_GPU();
  for (const bool fused : {true, false}) {
    for (const bool zero_copy : {false, true}) {
      SCOPED_TRACE(std::string(fused ? "fused forward" : "v1 forward") + (zero_copy ? ", zero-copy inputs" : ""));
      const LayerCase c{"twice_W2", 2, 91, 8, 3, true, true, kNormalized, RoutingCase::kZipf};
      const SeededStep s(c, c.routing);
      MoELayerOptions options;
      options.fused_forward = fused;
      options.ring_rows = 128;  // rows past the ring too
      LoopbackLayer l(c, s.weights, options);
      l.buffers.prepare(s.step, l.world);
      std::vector<MoEForwardArgs> args = l.buffers.forward_args();
      if (zero_copy) {
        for (size_t r = 0; r < args.size(); ++r) {
          const MoELayerBuffers own = l.layer.buffers(static_cast<int>(r));
          const RankBuffers& b = l.buffers.ranks[r];
          check_cuda(cudaMemcpy(own.x, b.x.get(), b.x.size() * 2, cudaMemcpyDeviceToDevice), "cudaMemcpy(x)");
          check_cuda(cudaMemcpy(own.topk_idx, b.topk_idx.get(), b.topk_idx.size() * 4, cudaMemcpyDeviceToDevice),
                     "cudaMemcpy(topk_idx)");
          check_cuda(cudaMemcpy(own.topk_scores, b.scores.get(), b.scores.size() * 4, cudaMemcpyDeviceToDevice),
                     "cudaMemcpy(topk_scores)");
          args[r].x = own.x;
          args[r].topk_idx = own.topk_idx;
          args[r].topk_scores = own.topk_scores;
        }
      }
      Stream stream;
      const MoEContext context = l.layer.forward(args, stream.get());
      l.layer.backward(l.buffers.backward_args(), context, stream.get());
      stream.sync();
      ASSERT_NO_THROW(l.layer.check());
      const std::vector<RankOutputs> once = l.buffers.download();
      expect_same_bits(once, backward_again(l, context, once, stream), "the second backward");
    }
  }
}

// A forward that read its inputs from the layer's own buffers cannot be replayed once a later
// forward rewrote them.
TEST(GpuMoELayerPending, ZeroCopyInputsAreNotReplayed) {
  CARACAL_REQUIRE_GPU();
  const auto l = prepared_layer(kApiCase, 2);
  auto& [world, owned_layer, layer, buffers] = *l;
  Stream stream;
  std::vector<MoEForwardArgs> zero_copy = buffers.forward_args();
  for (size_t r = 0; r < zero_copy.size(); ++r) {
    const MoELayerBuffers own = layer.buffers(static_cast<int>(r));
    zero_copy[r].x = own.x;
    zero_copy[r].topk_idx = own.topk_idx;
    zero_copy[r].topk_scores = own.topk_scores;
  }
  const MoEContext first = layer.forward(zero_copy, stream.get());
  const MoEContext second = layer.forward(buffers.forward_args(), stream.get());
  expect_error([&] { layer.backward(buffers.backward_args(), first, stream.get()); },
               {"forward 1 read ranks[0]'s inputs from the layer's own buffers", "cannot be replayed"});
  EXPECT_NO_THROW(layer.backward(buffers.backward_args(), second, stream.get()));
  stream.sync();
}

TEST(GpuMoELayerApi, SharedScaleNeedsItsGradient) {
  CARACAL_REQUIRE_GPU();
  LayerCase c = kApiCase;
  c.shared_scale = true;
  const auto l = prepared_layer(c, 3);
  auto& [world, owned_layer, layer, buffers] = *l;
  Stream stream;
  const MoEContext context = layer.forward(buffers.forward_args(), stream.get());
  std::vector<MoEBackwardArgs> backward = buffers.backward_args();
  backward[0].d_shared_scale = nullptr;
  expect_error([&] { layer.backward(backward, context, stream.get()); },
               {"ranks[0].d_shared_scale", "the forward was given a shared_scale", "got null"});
  stream.sync();
}

TEST(GpuMoELayerApi, ConstructorRejectsAMismatchedWorldOrASmallHeap) {
  CARACAL_REQUIRE_GPU();
  const LayerConfig config = config_of(kApiCase);
  comm::LoopbackWorld four(4, MoELayer::heap_bytes(config));
  expect_error([&] { MoELayer layer(config, four); }, {"config.ep_size (2) must equal the world's size (4)"});
  comm::LoopbackWorld small(2, MoELayer::heap_bytes(config) / 2);
  expect_error([&] { MoELayer layer(config, small); }, {"bytes of symmetric heap per rank (MoELayer::heap_bytes(config, options))"});
  // An FP8 layer (v1's buffers and expert_dx): half its heap refused by name, its own taken.
  LayerConfig fp8 = config;
  fp8.precision = Precision::kFP8;
  fp8.shape.shared_intermediate = 256;  // FP8 needs multiples of 128
  comm::LoopbackWorld half_heap(2, MoELayer::heap_bytes(fp8) / 2);
  expect_error([&] { MoELayer layer(fp8, half_heap); }, {"bytes of symmetric heap per rank (MoELayer::heap_bytes(config, options))"});
  comm::LoopbackWorld fp8_heap(2, MoELayer::heap_bytes(fp8));
  const MoELayer layer(fp8, fp8_heap);
  EXPECT_EQ(layer.ring_rows(), 0) << "an FP8 layer runs v1's launches";
}

// The activations come from the allocator the options name (the PyTorch binding's caching
// allocator): one block per local rank of MoELayer::memory().local bytes, given back when the layer
// goes; the step is the same bits as with cudaMalloc.
TEST(GpuMoELayerApi, LocalMemoryComesFromTheGivenAllocator) {
  CARACAL_REQUIRE_GPU();
  const LayerCase c{"allocator_W2", 2, 45, 8, 2, true, true, kNormalized, RoutingCase::kZipf};
  const SeededStep s(c, RoutingCase::kZipf);
  std::vector<size_t> taken;
  int given_back = 0;
  MoELayerOptions options;
  options.local_allocator.allocate = [&](size_t bytes) {
    taken.push_back(bytes);
    void* p = nullptr;
    return cudaMalloc(&p, bytes) == cudaSuccess ? p : nullptr;
  };
  options.local_allocator.free = [&](void* p) {
    ++given_back;
    (void)cudaFree(p);
  };
  std::vector<RankOutputs> with_allocator;
  {
    LoopbackLayer l(c, s.weights, options);
    EXPECT_EQ(taken, std::vector<size_t>(2, MoELayer::memory(config_of(c)).local));
    l.buffers.prepare(s.step, l.world);
    const Stream stream;
    run_step(l.layer, l.buffers, stream);
    with_allocator = l.buffers.download();
    EXPECT_EQ(given_back, 0);
  }
  EXPECT_EQ(given_back, 2);
  expect_same_bits(run_once(c, s.weights, s.step), with_allocator, "cudaMalloc vs the given allocator");

  MoELayerOptions half;
  half.local_allocator.allocate = options.local_allocator.allocate;
  comm::LoopbackWorld world(2, MoELayer::heap_bytes(config_of(c)));
  expect_error([&] { MoELayer layer(config_of(c), world, half); }, {"local_allocator needs both allocate and free"});
}

TEST(GpuMoELayerApi, OutOfRangeExpertIdIsRaisedAtCheck) {
  CARACAL_REQUIRE_GPU();
  const LayerCase& c = kApiCase;
  LoopbackLayer l(c, random_weights(c, 4));
  auto& [world, owned_layer, layer, buffers] = l;
  HostStep step = random_step(c, RoutingCase::kUniform, 5);
  step.routing.topk_idx[static_cast<size_t>((1 * c.tokens + 5) * c.top_k)] = c.experts;  // rank 1, token 5, slot 0
  buffers.prepare(step, world);
  Stream stream;
  const MoEContext context = layer.forward(buffers.forward_args(), stream.get());
  layer.backward(buffers.backward_args(), context, stream.get());
  stream.sync();
  expect_error([&] { layer.check(); }, {"topk_idx of rank 1 holds expert id 8 at [token 5][slot 0]"});
  EXPECT_NO_THROW(layer.check()) << "the fault is raised once";
}

}  // namespace
}  // namespace caracal::layer_test
