// MoELayer when things go wrong, on the GPU (loopback worlds):
//   * a rank stalled past the wait timeout (injected: its CTAs arrive late): the pass's outputs are
//     poisoned (NaN), check() and the next forward throw until reset(), and the step after reset()
//     is exact; a stall in backward poisons backward's outputs; a stall below the timeout is fine;
//     a step captured into a CUDA graph before the stall recovers the same way, replay after replay;
//   * edge numerics: tokens whose valid scores sum to 0 get g = 0 (exact against the reference,
//     no NaN); a NaN in one token's x stays in that token's outputs and in the weight gradients of
//     the experts it reached (and the shared expert's), nowhere else; an Inf in one token's x makes
//     that token's y non-finite and no other.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "caracal/comm/loopback_world.hpp"
#include "caracal/error.hpp"
#include "caracal/moe_layer.hpp"
#include "exchange_test_support.hpp"
#include "gpu_test_util.hpp"
#include "moe_layer_test_support.hpp"

namespace caracal::layer_test {
namespace {

std::string error_message(MoELayer& layer) {
  try {
    layer.check();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Fills every output buffer of every local rank with zeros (a finite value the layer must replace).
void zero_outputs(const WorldBuffers& buffers) {
  for (const RankBuffers& r : buffers.ranks) {
    for (const auto* a : {&r.y, &r.dx}) CARACAL_ASSERT_CUDA(cudaMemset(a->get(), 0, a->size() * 2));
    for (const auto* a : {&r.d_scores, &r.d_w_gate_up, &r.d_w_down, &r.d_shared_w_gate_up, &r.d_shared_w_down,
                          &r.d_shared_scale}) {
      if (a->get() != nullptr) CARACAL_ASSERT_CUDA(cudaMemset(a->get(), 0, a->size() * 4));
    }
  }
  exchange_test::settle();
}

template <typename T>
size_t count_nan(const std::vector<T>& values) {
  size_t n = 0;
  for (const T& v : values) {
    if constexpr (std::is_same_v<T, uint16_t>) {
      n += std::isnan(bf16_to_float(v)) ? 1 : 0;
    } else {
      n += std::isnan(v) ? 1 : 0;
    }
  }
  return n;
}

void expect_all_nan(const std::vector<RankOutputs>& outputs, bool forward, bool backward) {
  for (size_t r = 0; r < outputs.size(); ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const RankOutputs& o = outputs[r];
    if (forward) {
      EXPECT_EQ(count_nan(o.y), o.y.size()) << "y";
    }
    if (!backward) continue;
    EXPECT_EQ(count_nan(o.dx), o.dx.size()) << "dx";
    EXPECT_EQ(count_nan(o.d_scores), o.d_scores.size()) << "d_topk_scores";
    EXPECT_EQ(count_nan(o.d_w_gate_up), o.d_w_gate_up.size()) << "d_w_gate_up";
    EXPECT_EQ(count_nan(o.d_w_down), o.d_w_down.size()) << "d_w_down";
    EXPECT_EQ(count_nan(o.d_shared_w_gate_up), o.d_shared_w_gate_up.size()) << "d_shared_w_gate_up";
    EXPECT_EQ(count_nan(o.d_shared_w_down), o.d_shared_w_down.size()) << "d_shared_w_down";
    EXPECT_EQ(count_nan(o.d_shared_scale), o.d_shared_scale.size()) << "d_shared_scale";
  }
}

// ---- Stalled ranks ---------------------------------------------------------------------------------

// A loopback layer of `c` about to stall: the weights and inputs of `s` uploaded, every output zeroed (a
// finite value the poisoning must replace), waits timing out after 200 ms.
std::unique_ptr<LoopbackLayer> layer_to_stall(const LayerCase& c, const SeededStep& s) {
  auto l = std::make_unique<LoopbackLayer>(c, s.weights);
  l->buffers.prepare(s.step, l->world);
  zero_outputs(l->buffers);
  l->world.set_wait_timeout(std::chrono::milliseconds(200), nullptr);
  exchange_test::settle();  // the legacy stream does not order against the tests' streams
  return l;
}

// Local rank 0's fault flag (comm::World::fault_flag), once the device is idle.
float fault_flag(const comm::World& world) {
  exchange_test::settle();
  float flag = -1.0f;
  check_cuda(cudaMemcpy(&flag, world.fault_flag(0), sizeof(flag), cudaMemcpyDeviceToHost), "cudaMemcpy(fault flag)");
  return flag;
}

class GpuMoELayerStall : public testing::TestWithParam<int> {};

TEST_P(GpuMoELayerStall, PoisonsThePassRefusesWorkUntilResetThenIsExact) {
  CARACAL_REQUIRE_GPU();
  const int world_size = GetParam();
  const LayerCase c{"stall", world_size, 61, 4 * world_size, 3, true, true, kNormalized, RoutingCase::kUniform};
  const SeededStep s(c, RoutingCase::kUniform);
  const auto l = layer_to_stall(c, s);
  auto& [world, owned_layer, layer, buffers] = *l;
  Stream stream;

  // The last rank's CTAs arrive 30 s late at the forward's first barrier; the others give up after
  // 200 ms and abort the world, which ends every later wait at once.
  world.stall_next_barrier(world_size - 1, std::chrono::seconds(30), stream.get());
  const auto start = std::chrono::steady_clock::now();
  const MoEContext context = layer.forward(buffers.forward_args(), stream.get());
  layer.backward(buffers.backward_args(), context, stream.get());
  stream.sync();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  expect_all_nan(buffers.download(), true, true);
  EXPECT_EQ(fault_flag(world), 1.0f);

  const std::string message = error_message(layer);
  EXPECT_TRUE(contains(message, "waited for rank " + std::to_string(world_size - 1))) << message;
  EXPECT_TRUE(contains(message, "'TokenExchange::build_schedule'")) << message;
  EXPECT_TRUE(contains(message, "poisoned (NaN)")) << message;
  EXPECT_EQ(error_message(layer), message) << "check() keeps raising until reset()";
  try {
    (void)layer.forward(buffers.forward_args(), stream.get());
    ADD_FAILURE() << "forward ran on a faulted world";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "World::reset()")) << e.what();
  }

  layer.reset(stream.get());
  world.set_wait_timeout(comm::World::kDefaultWaitTimeout, stream.get());
  EXPECT_EQ(fault_flag(world), 0.0f);
  try {
    layer.backward(buffers.backward_args(), context, stream.get());
    ADD_FAILURE() << "backward accepted a context from before reset()";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "since its last reset()")) << e.what();
  }
  const HostStep next = random_step(c, RoutingCase::kZipf, s.seed.value() + 1);
  buffers.prepare(next, world);
  run_step(layer, buffers, stream);
  expect_step_matches(c, next, reference_for(c, s.weights, next), buffers.download());
}

TEST_P(GpuMoELayerStall, InBackwardPoisonsBackwardsOutputs) {
  CARACAL_REQUIRE_GPU();
  const int world_size = GetParam();
  const LayerCase c{"stall_backward", world_size, 45, 4 * world_size, 2, true, false, kNormalized,
                    RoutingCase::kUniform};
  const SeededStep s(c, RoutingCase::kUniform);
  const auto l = layer_to_stall(c, s);
  auto& [world, owned_layer, layer, buffers] = *l;
  Stream stream;
  const MoEContext context = layer.forward(buffers.forward_args(), stream.get());
  // Backward's first launch: after the fused forward with the fused backward (the defaults), the
  // reverse combine of the first macrobatch's dy rows, which carries the pass's world barrier.
  world.stall_next_barrier(0, std::chrono::seconds(30), stream.get());
  layer.backward(buffers.backward_args(), context, stream.get());
  stream.sync();
  const std::vector<RankOutputs> got = buffers.download();
  expect_all_nan(got, false, true);
  for (const RankOutputs& o : got) EXPECT_EQ(count_nan(o.y), 0u) << "the forward finished before the stall";
  EXPECT_TRUE(contains(error_message(layer), "'TokenExchange::reverse_combine'")) << error_message(layer);
  layer.reset(stream.get());
  check_step(c, layer, buffers, s.weights, RoutingCase::kEmptySlots, stream);
}

TEST_P(GpuMoELayerStall, BelowTheTimeoutIsNoError) {
  CARACAL_REQUIRE_GPU();
  const int world_size = GetParam();
  const LayerCase c{"short_stall", world_size, 37, 2 * world_size, 2, true, false, kNormalized,
                    RoutingCase::kUniform};
  const HostWeights weights = random_weights(c, fresh_seed());
  LoopbackLayer l(c, weights);
  auto& [world, owned_layer, layer, buffers] = l;
  Stream stream;
  world.set_wait_timeout(std::chrono::seconds(10), stream.get());
  world.stall_next_barrier(world_size - 1, std::chrono::milliseconds(500), stream.get());
  check_step(c, layer, buffers, weights, RoutingCase::kZipf, stream);
  EXPECT_EQ(fault_flag(world), 0.0f);
}

// A training loop that only replays a captured step: a stall in a replay (the graph was captured
// before the timeout was lowered and before the stall was armed) times out, poisons the step,
// raises at check() and sets the fault flag; after reset() the same graph gives bitwise the step
// it gave before the stall; a stall in a later replay is reported again.
TEST_P(GpuMoELayerStall, GraphReplaysRecoverAfterResetAndReportTheNextStall) {
  CARACAL_REQUIRE_GPU();
  const int world_size = GetParam();
  const LayerCase c{"stall_graph", world_size, 53, 4 * world_size, 3, true, true, kNormalized, RoutingCase::kUniform};
  const SeededStep s(c, RoutingCase::kZipf);
  LoopbackLayer l(c, s.weights);
  auto& [world, owned_layer, layer, buffers] = l;
  Stream stream;
  buffers.prepare(s.step, world);
  run_step(layer, buffers, stream);  // an eager step first: every kernel's module is loaded before the capture
  const test::CapturedGraph graph(stream, [&](cudaStream_t st) {
    const MoEContext context = layer.forward(buffers.forward_args(), st);
    layer.backward(buffers.backward_args(), context, st);
  });
  const auto replay = [&] {
    graph.launch(stream);
    stream.sync();
    return buffers.download();
  };
  const std::vector<RankOutputs> clean = replay();
  ASSERT_NO_THROW(layer.check());
  expect_step_matches(c, s.step, reference_for(c, s.weights, s.step), clean);
  EXPECT_EQ(fault_flag(world), 0.0f);

  for (int stall = 0; stall < 2; ++stall) {
    SCOPED_TRACE("stall " + std::to_string(stall));
    world.set_wait_timeout(std::chrono::milliseconds(200), stream.get());
    world.stall_next_barrier(world_size - 1, std::chrono::seconds(30), stream.get());
    const auto start = std::chrono::steady_clock::now();
    expect_all_nan(replay(), true, true);
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
    EXPECT_EQ(fault_flag(world), 1.0f);
    const std::string message = error_message(layer);
    EXPECT_TRUE(contains(message, "waited for rank " + std::to_string(world_size - 1))) << message;
    EXPECT_TRUE(contains(message, "200 ms")) << message;
    EXPECT_TRUE(contains(message, "'TokenExchange::build_schedule'")) << message;

    layer.reset(stream.get());
    world.set_wait_timeout(comm::World::kDefaultWaitTimeout, stream.get());
    const std::vector<RankOutputs> again = replay();
    ASSERT_NO_THROW(layer.check());
    EXPECT_EQ(fault_flag(world), 0.0f);
    expect_same_bits(clean, again, "the replay after reset() against the one before the stall");
  }
}

INSTANTIATE_TEST_SUITE_P(Loopback, GpuMoELayerStall, testing::Values(2, 4),
                         [](const testing::TestParamInfo<int>& p) { return "W" + std::to_string(p.param); });

// ---- Edge numerics -----------------------------------------------------------------------------------

// One step of `c` from a fresh seed with x[rank][token][d] = `bad`: the layer's outputs, and the
// reference of the clean step (without the bad value).
struct BadTokenRun {
  BadTokenRun(const LayerCase& c, size_t rank, size_t token, size_t d, float bad)
      : clean(c, RoutingCase::kUniform),
        got(run_once(c, clean.weights, with_bad_x(clean.step, rank, token * kHidden + d, bad))),
        want(reference_for(c, clean.weights, clean.step)) {}

  static HostStep with_bad_x(HostStep step, size_t rank, size_t i, float bad) {
    step.x[rank][i] = bf16_bits(bad);
    return step;
  }

  const SeededStep clean;
  std::vector<RankOutputs> got;
  const StepExpected want;
};

// Tokens whose valid scores sum to exactly 0 (all zero, or +s and -s): g = 0, no NaN anywhere, and
// everything matches the reference, which defines it so.
TEST(GpuMoELayerNumerics, ZeroScoreSumGivesZeroWeights) {
  CARACAL_REQUIRE_GPU();
  const LayerCase c{"zero_sum_W2", 2, 53, 8, 3, true, false, kNormalized, RoutingCase::kUniform};
  const SeededStep s(c, RoutingCase::kUniform);
  HostStep step = s.step;
  const size_t k = static_cast<size_t>(c.top_k);
  for (size_t t = 0; t < static_cast<size_t>(c.tokens); t += 4) {  // every 4th token of each rank
    for (size_t r = 0; r < static_cast<size_t>(c.world); ++r) {
      float* scores = step.scores[r].data() + t * k;
      if (t % 8 == 0) {
        scores[0] = scores[1] = scores[2] = 0.0f;
      } else {
        scores[0] = 0.25f;
        scores[1] = -0.25f;
        scores[2] = 0.0f;
      }
    }
  }
  expect_step_matches(c, step, reference_for(c, s.weights, step), run_once(c, s.weights, step));
}

// A NaN in one token's x: that token's y, dx and score gradients are NaN; every other token's
// outputs are finite and exact; the weight gradients of the experts the token reached (and of
// the shared expert, which sees every token) are NaN, as autograd's would be; every other
// expert's are finite and exact.
TEST(GpuMoELayerNumerics, NanInOneTokenStaysInThatToken) {
  CARACAL_REQUIRE_GPU();
  const LayerCase c{"nan_token_W2", 2, 61, 8, 2, true, false, kNormalized, RoutingCase::kUniform};
  constexpr size_t kRank = 1, kToken = 17;
  BadTokenRun run(c, kRank, kToken, 3, std::numeric_limits<float>::quiet_NaN());
  // The reference of the clean step holds for everything the bad token does not reach.
  std::vector<RankOutputs>& got = run.got;
  const StepExpected& want = run.want;
  const Routing& routing = run.clean.step.routing;
  const size_t k = static_cast<size_t>(c.top_k), D = kHidden, L = static_cast<size_t>(c.experts / c.world);
  std::set<int> reached;
  for (size_t j = 0; j < k; ++j) reached.insert(routing.rank_topk(kRank)[kToken * k + j]);
  const RankOutputs& bad = got[kRank];
  for (size_t d = 0; d < D; ++d) {
    EXPECT_TRUE(std::isnan(bf16_to_float(bad.y[kToken * D + d]))) << "y[" << d << "]";
    EXPECT_TRUE(std::isnan(bf16_to_float(bad.dx[kToken * D + d]))) << "dx[" << d << "]";
  }
  // Compare the rest: replace the bad token's rows by the reference's, and the reached experts'
  // gradients (checked for NaN first) likewise, then run the usual checks.
  for (size_t d = 0; d < D; ++d) {
    got[kRank].y[kToken * D + d] = bf16_bits(static_cast<float>(want.ranks[kRank].forward.y[kToken * D + d]));
    got[kRank].dx[kToken * D + d] = bf16_bits(static_cast<float>(want.ranks[kRank].grads.dx[kToken * D + d]));
  }
  for (size_t j = 0; j < k; ++j) {
    if (routing.rank_topk(kRank)[kToken * k + j] < 0) continue;
    EXPECT_TRUE(std::isnan(got[kRank].d_scores[kToken * k + j])) << "d_topk_scores slot " << j;
    got[kRank].d_scores[kToken * k + j] = static_cast<float>(want.ranks[kRank].grads.d_topk_scores[kToken * k + j]);
  }
  const size_t I = kIntermediate;
  for (int e : reached) {
    if (e < 0) continue;
    RankOutputs& owner = got[static_cast<size_t>(e) / L];
    const size_t local = static_cast<size_t>(e) % L;
    EXPECT_EQ(count_nan(std::vector<float>(owner.d_w_down.begin() + local * D * I, owner.d_w_down.begin() + (local + 1) * D * I)),
              D * I)
        << "d_w_down of expert " << e;
    // Put the reference's gradient in (interleaved like the kernels' layout) for the checks below.
    std::vector<float> gate(I * D), up(I * D), gate_up(2 * I * D);
    const ExpertGradients& g = want.routed[static_cast<size_t>(e)];
    for (size_t i = 0; i < I * D; ++i) {
      gate[i] = static_cast<float>(g.gate[i]);
      up[i] = static_cast<float>(g.up[i]);
    }
    interleave_gate_up_weights_host(gate.data(), up.data(), gate_up.data(), 1, kIntermediate, kHidden);
    std::copy(gate_up.begin(), gate_up.end(), owner.d_w_gate_up.begin() + static_cast<int64_t>(local * 2 * I * D));
    for (size_t i = 0; i < D * I; ++i) owner.d_w_down[local * D * I + i] = static_cast<float>(g.down[i]);
  }
  // The shared expert's gradients are per rank: the bad rank's saw the token, rank 0's did not.
  EXPECT_EQ(count_nan(got[kRank].d_shared_w_down), got[kRank].d_shared_w_down.size());
  EXPECT_EQ(count_nan(got[0].d_shared_w_down), 0u);
  std::vector<std::string> failures = step_failures(c, run.clean.step, want, got);
  // The shared expert's gradients of the bad rank are NaN by design: drop those lines.
  failures.erase(std::remove_if(failures.begin(), failures.end(),
                                [](const std::string& f) { return f.find("rank 1 d_shared_w_") == 0; }),
                 failures.end());
  EXPECT_EQ(failures, std::vector<std::string>{});
}

// An Inf in one token's x: that token's y is non-finite everywhere; every other token's y is
// finite and matches the reference of the same step without the Inf.
TEST(GpuMoELayerNumerics, InfInOneTokenStaysInThatTokensOutput) {
  CARACAL_REQUIRE_GPU();
  const LayerCase c{"inf_token_W2", 2, 53, 8, 2, true, false, kNormalized, RoutingCase::kUniform};
  constexpr size_t kRank = 0, kToken = 29;
  BadTokenRun run(c, kRank, kToken, 11, std::numeric_limits<float>::infinity());
  const size_t D = kHidden;
  size_t finite = 0;
  for (size_t d = 0; d < D; ++d) {
    finite += std::isfinite(bf16_to_float(run.got[kRank].y[kToken * D + d])) ? 1 : 0;
    run.got[kRank].y[kToken * D + d] = bf16_bits(static_cast<float>(run.want.ranks[kRank].forward.y[kToken * D + d]));
  }
  EXPECT_EQ(finite, 0u) << "elements of the Inf token's y are finite";
  for (size_t r = 0; r < run.got.size(); ++r) {
    const std::vector<RankOutputs>& got = run.got;
    const std::vector<std::string> failures = test::compare_rows(
        "rank " + std::to_string(r) + " y", [&](size_t i) { return static_cast<double>(bf16_to_float(got[r].y[i])); },
        run.want.ranks[r].forward.y, static_cast<size_t>(c.tokens), D, kLayerBounds.y);
    EXPECT_EQ(failures, std::vector<std::string>{});
  }
}

}  // namespace
}  // namespace caracal::layer_test
