// TokenExchange::dispatch_fp8 and reverse_combine_fp8 (ExchangeOptions::fp8_dispatch,
// fp8_reverse_combine): every schedule row gets its home token's e4m3 codes and 1 x 128 scales bit
// for bit (and, for dy, its route's g), the scales read from and stored in the FP8 GEMMs' MN-major
// layout (home: over T rounded up to tile_m rows);
// padding rows zero codes under the scale of a zero block; nothing past the schedule's rows is
// written. In loopback at W = 1, 2, 4, 8 on every routing case, per (token, rank) and per route,
// with fresh random codes and scales (any byte is a code here: NaN codes travel too) and every
// output poisoned first; and from a CUDA graph with new routing and inputs each replay.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "caracal/block_fp8.hpp"
#include "caracal/comm/loopback_world.hpp"
#include "caracal/error.hpp"
#include "caracal/routing.hpp"
#include "caracal/schedule.hpp"
#include "caracal/transfer/token_exchange.hpp"
#include "error_checks.hpp"
#include "exchange_test_support.hpp"
#include "gpu_test_util.hpp"

namespace caracal::exchange_test {
namespace {

using transfer::ExchangeOptions;
using transfer::ExchangeShape;
using transfer::TokenExchange;

constexpr int64_t kBlock = 128;

const ExchangeShape kShapes[] = {
    {200, 6, 256, 16, 128},  // 16 vectors a row: under one warp's lanes; two scales a row
    {64, 10, 1024, 32, 8},   // 64 vectors: whole unrolled batches; small tiles
    {40, 36, 4608, 48, 8},   // k > 32: a token's slots in two rounds; 36 scales a row: two rounds of lanes
};

// Every rank's home rows: codes [Th][D], scales [D/128][Th] (Th = T rounded up to tile_m; the rows
// past T random too: never pulled).
struct Fp8Inputs {
  int64_t home_rows = 0;                    // Th
  std::vector<std::vector<uint8_t>> codes;  // [W][Th*D]
  std::vector<std::vector<float>> scales;   // [W][D/128*Th]
  std::vector<std::vector<float>> gates;    // [W][T*k] (dy's pull)
};

Fp8Inputs make_inputs(const ExchangeShape& shape, int64_t home_rows, int64_t world, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> scale(1e-6f, 4.0f);
  Fp8Inputs in;
  in.home_rows = home_rows;
  for (int64_t r = 0; r < world; ++r) {
    std::vector<uint8_t> codes(static_cast<size_t>(home_rows * shape.hidden));
    for (uint8_t& c : codes) c = static_cast<uint8_t>(rng());
    std::vector<float> scales(static_cast<size_t>(home_rows * shape.hidden / kBlock));
    for (float& s : scales) s = scale(rng);
    std::vector<float> gates(static_cast<size_t>(shape.tokens * shape.top_k));
    for (float& g : gates) g = scale(rng);
    in.codes.push_back(std::move(codes));
    in.scales.push_back(std::move(scales));
    in.gates.push_back(std::move(gates));
  }
  return in;
}

// One rank's expected expert_x_codes [S][D] and expert_x_scales [D/128][S]: the schedule's rows from
// their home tokens, padding rows zero codes under the zero block's scale, the rest poison.
struct ExpectedRows {
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  std::vector<float> gates;  // [S]: each row's route's g, 0 for padding, poison past the schedule
};

ExpectedRows expected_rows(const ExchangeShape& shape, const RankSchedule& rs, const Fp8Inputs& in, int64_t stride) {
  const int64_t D = shape.hidden, blocks = D / kBlock;
  float poisoned;
  std::memset(&poisoned, kNanByte, sizeof poisoned);
  ExpectedRows want{std::vector<uint8_t>(static_cast<size_t>(stride * D), kNanByte),
                    std::vector<float>(static_cast<size_t>(blocks * stride), poisoned),
                    std::vector<float>(static_cast<size_t>(stride), poisoned)};
  const float zero_scale = block_scale(0.0f, ScaleRounding::kExact).scale;
  for (int64_t row = 0; row < static_cast<int64_t>(rs.rows.size()); ++row) {
    const ScheduleRow& r = rs.rows[static_cast<size_t>(row)];
    const int64_t token = r.src_route / shape.top_k;
    for (int64_t c = 0; c < D; ++c) {
      want.codes[row * D + c] = r.is_padding() ? 0 : in.codes[static_cast<size_t>(r.src_rank)][token * D + c];
    }
    want.gates[static_cast<size_t>(row)] =
        r.is_padding() ? 0.0f : in.gates[static_cast<size_t>(r.src_rank)][static_cast<size_t>(r.src_route)];
    for (int64_t b = 0; b < blocks; ++b) {
      want.scales[b * stride + row] =
          r.is_padding() ? zero_scale : in.scales[static_cast<size_t>(r.src_rank)][b * in.home_rows + token];
    }
  }
  return want;
}

// The exchange's schedule view rows: the scales' stride.
int64_t scale_stride(const TokenExchange& ex) { return ex.schedule_view(0).buffer_rows(); }

// Which pull: dispatch_fp8 (x) or reverse_combine_fp8 (dy, with g).
enum class Pull { kX, kDy };

// The pull's buffers in the exchange.
struct PullBuffers {
  transfer::Sym<__nv_fp8_e4m3> codes, expert_codes;
  transfer::Sym<float> scales, expert_scales;
};
PullBuffers buffers_of(const TokenExchange& ex, Pull pull) {
  if (pull == Pull::kX) {
    const auto& f = ex.forward_buffers();
    return {f.x_codes, f.expert_x_codes, f.x_scales, f.expert_x_scales};
  }
  const auto& b = ex.backward_buffers();
  return {b.dy_codes, b.expert_dy_codes, b.dy_scales, b.expert_dy_scales};
}

// Fresh inputs for `routing`, outputs poisoned; schedule() builds the schedule, then (dy: the gates
// overwritten with the inputs') pull() runs; every rank's rows checked.
template <typename ScheduleLaunch, typename PullLaunch>
void run_and_check(TokenExchange& ex, Pull which, const Routing& routing, uint64_t seed, ScheduleLaunch schedule_launch,
                   PullLaunch pull_launch) {
  const comm::World& world = ex.world();
  const ExchangeShape& shape = ex.shape();
  const int64_t D = shape.hidden, blocks = D / kBlock, routes = ex.sizes().routes, S = scale_stride(ex);
  const Schedule schedule = build_schedule(routing, shape.num_experts, shape.tile_m);
  const Fp8Inputs in = make_inputs(shape, ex.sizes().home_rows, world.world_size(), seed);
  const PullBuffers b = buffers_of(ex, which);
  for (int l = 0; l < world.local_ranks(); ++l) {
    const size_t rank = static_cast<size_t>(world.first_local_rank() + l);
    const int32_t* ids = routing.rank_topk(static_cast<int64_t>(rank));
    upload(world, ex.schedule_buffers().topk_idx, l, std::vector<int32_t>(ids, ids + routes));
    upload(world, b.codes, l, in.codes[rank]);
    upload(world, b.scales, l, in.scales[rank]);
    poison(world, b.expert_codes, l, S * D, kNanByte);
    poison(world, b.expert_scales, l, blocks * S, kNanByte);
    poison(world, ex.backward_buffers().expert_gates, l, S, kNanByte);
  }
  settle();
  schedule_launch();
  if (which == Pull::kDy) {
    for (int l = 0; l < world.local_ranks(); ++l) {
      upload(world, ex.router_buffers().gates, l, in.gates[static_cast<size_t>(world.first_local_rank() + l)]);
    }
    settle();
  }
  pull_launch();
  ASSERT_NO_THROW(ex.check());
  const char* what = which == Pull::kX ? "x" : "dy";
  for (int l = 0; l < world.local_ranks(); ++l) {
    const size_t rank = static_cast<size_t>(world.first_local_rank() + l);
    SCOPED_TRACE(std::string(what) + ", rank " + std::to_string(rank));
    const ExpectedRows want = expected_rows(shape, schedule.ranks[rank], in, S);
    expect_same_bits(download<uint8_t>(world, b.expert_codes, l, S * D), want.codes, "expert codes");
    expect_same_bits(download<float>(world, b.expert_scales, l, blocks * S), want.scales, "expert scales");
    if (which == Pull::kDy) {
      expect_same_bits(download<float>(world, ex.backward_buffers().expert_gates, l, S), want.gates, "expert_gates");
    }
  }
}

ExchangeOptions fp8_options(bool per_route) {
  ExchangeOptions options{true, true, false};
  options.fp8_dispatch = true;
  options.fp8_reverse_combine = true;
  options.rows_per_route = per_route;
  return options;
}

struct DispatchCase {
  int world;
  RoutingCase routing;
  int shape;
  bool per_route;
};

std::string name_of(const DispatchCase& c) {
  return "W" + std::to_string(c.world) + "_" + name_of(c.routing) + "_shape" + std::to_string(c.shape) +
         (c.per_route ? "_per_route" : "_per_token_rank");
}

std::vector<DispatchCase> dispatch_cases() {
  std::vector<DispatchCase> cases;
  for (const auto& [world, routing] : loopback_sweep()) cases.push_back({world, routing, 0, false});
  for (int world : {1, 2, 4}) {
    for (RoutingCase routing : {RoutingCase::kUniform, RoutingCase::kDuplicates, RoutingCase::kAllToOne}) {
      cases.push_back({world, routing, 1, false});
      cases.push_back({world, routing, 2, false});
      cases.push_back({world, routing, 1, true});
    }
  }
  return cases;
}

class GpuDispatchFp8 : public testing::TestWithParam<DispatchCase> {};

TEST_P(GpuDispatchFp8, RowsAreTheirHomeTokensBitForBit) {  // x's (dispatch_fp8), then dy's (reverse_combine_fp8)
  CARACAL_REQUIRE_GPU();
  const DispatchCase& c = GetParam();
  const ExchangeShape& shape = kShapes[c.shape];
  const ExchangeOptions options = fp8_options(c.per_route);
  comm::LoopbackWorld world(c.world, TokenExchange::heap_bytes(shape, c.world, options));
  TokenExchange ex(world, shape, options);
  Stream stream;
  for (int step = 0; step < 2; ++step) {  // the second reuses every buffer with new data
    const uint64_t seed = fresh_seed();
    SCOPED_TRACE(seed_note(seed));
    const Routing routing = make_test_routing(c.routing, c.world, shape.tokens, shape.top_k, shape.num_experts, seed);
    const auto schedule = [&] {
      ex.build_schedule(RouterNormalization{}, stream.get());
      stream.sync();
    };
    run_and_check(ex, Pull::kX, routing, seed, schedule, [&] {
      ex.dispatch_fp8(stream.get());
      stream.sync();
    });
    run_and_check(ex, Pull::kDy, routing, seed, schedule, [&] {
      ex.reverse_combine_fp8(stream.get());
      stream.sync();
    });
  }
}

std::string case_name(const testing::TestParamInfo<DispatchCase>& info) { return name_of(info.param); }

INSTANTIATE_TEST_SUITE_P(Loopback, GpuDispatchFp8, testing::ValuesIn(dispatch_cases()), case_name);

// Captured once, replayed with new routing and inputs each time.
TEST(GpuDispatchFp8Graph, ReplaysExactlyWithNewRoutingAndInputs) {
  CARACAL_REQUIRE_GPU();
  for (int world_size : {1, 4}) {
    SCOPED_TRACE("W" + std::to_string(world_size));
    const ExchangeShape& shape = kShapes[1];
    const ExchangeOptions options = fp8_options(false);
    comm::LoopbackWorld world(world_size, TokenExchange::heap_bytes(shape, world_size, options));
    TokenExchange ex(world, shape, options);
    Stream stream;
    const test::CapturedGraph forward(stream, [&](cudaStream_t s) {
      ex.build_schedule(RouterNormalization{}, s);
      ex.dispatch_fp8(s);
    });
    const test::CapturedGraph backward(stream, [&](cudaStream_t s) { ex.reverse_combine_fp8(s); });
    for (RoutingCase routing_case : {RoutingCase::kUniform, RoutingCase::kAllToOne, RoutingCase::kEmptySlots}) {
      const uint64_t seed = fresh_seed();
      SCOPED_TRACE(std::string(name_of(routing_case)) + ", " + seed_note(seed));
      const Routing routing =
          make_test_routing(routing_case, world_size, shape.tokens, shape.top_k, shape.num_experts, seed);
      const auto replay = [&](const test::CapturedGraph& graph) {
        return [&] {
          graph.launch(stream);
          stream.sync();
        };
      };
      run_and_check(ex, Pull::kX, routing, seed, replay(forward), [] {});
      run_and_check(
          ex, Pull::kDy, routing, seed,
          [&] {
            ex.build_schedule(RouterNormalization{}, stream.get());
            stream.sync();
          },
          replay(backward));
    }
  }
}

TEST(GpuDispatchFp8Api, RefusesWithoutTheOptionAndBadShapes) {
  CARACAL_REQUIRE_GPU();
  const ExchangeShape shape = kShapes[0];
  const ExchangeOptions plain{true, true, false};
  comm::LoopbackWorld world(2, TokenExchange::heap_bytes(shape, 2, plain));
  TokenExchange ex(world, shape, plain);
  test::expect_error([&] { ex.dispatch_fp8(nullptr); },
                     {"TokenExchange::dispatch_fp8", "ExchangeOptions::fp8_dispatch = true"});
  test::expect_error([&] { ex.reverse_combine_fp8(nullptr); },
                     {"TokenExchange::reverse_combine_fp8", "ExchangeOptions::fp8_reverse_combine = true"});
  ExchangeShape odd = shape;
  odd.hidden = 200;  // a multiple of 8, not of 128
  test::expect_error([&] { (void)TokenExchange::heap_bytes(odd, 2, fp8_options(false)); },
                     {"options.fp8_dispatch", "hidden a multiple of 128", "hidden = 200"});
  ExchangeOptions dy_only = fp8_options(false);
  dy_only.fp8_dispatch = false;
  test::expect_error([&] { (void)TokenExchange::heap_bytes(odd, 2, dy_only); },
                     {"options.fp8_reverse_combine", "hidden a multiple of 128", "hidden = 200"});
  ExchangeOptions ring = fp8_options(false);
  ring.expert_out = false;
  ring.ring_rows = 128;
  test::expect_error([&] { (void)TokenExchange::heap_bytes(shape, 2, ring); },
                     {"options.fp8_dispatch", "ring_rows = 0", "ring_rows = 128"});
}

}  // namespace
}  // namespace caracal::exchange_test
