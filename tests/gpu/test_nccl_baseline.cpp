// The NCCL baseline exchange (bench/baselines/nccl_baseline_exchange.hpp) against TokenExchange at W = 1
// (NCCL takes one rank per GPU): on the same inputs, each expert's dispatched rows equal
// TokenExchange's row for row (the documented mapping: at W = 1 both keep (token, slot) order
// inside an expert; TokenExchange's padding rows aside), and combine's y is bit-identical. Two
// steps per case with fresh routing and data reuse every buffer of both exchanges.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "caracal/bf16.hpp"
#include "caracal/comm/cuda_memory.hpp"
#include "caracal/comm/loopback_world.hpp"
#include "caracal/comm/nccl_bootstrap.hpp"
#include "caracal/layer_config.hpp"
#include "caracal/routing.hpp"
#include "caracal/transfer/token_exchange.hpp"
#include "exchange_test_support.hpp"
#include "gpu_test_util.hpp"
#include "nccl_baseline_exchange.hpp"

namespace caracal::exchange_test {
namespace {

using transfer::ExchangeOptions;
using transfer::ExchangeShape;
using transfer::TokenExchange;

using Bf16Rows = std::vector<uint16_t>;
constexpr uint16_t kBf16Nan = 0xFFFF;

Bf16Rows random_rows(int64_t values, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> value(-4.0f, 4.0f);
  Bf16Rows rows(static_cast<size_t>(values));
  for (uint16_t& v : rows) v = bf16_bits(value(rng));
  return rows;
}

// Rows [first, first + count) of a [rows][hidden] host buffer.
Bf16Rows rows_of(const Bf16Rows& all, int64_t first, int64_t count, int64_t hidden) {
  return Bf16Rows(all.begin() + first * hidden, all.begin() + (first + count) * hidden);
}

const ExchangeShape kShapes[] = {
    {200, 6, 200, 16, 128},  // 25 vectors per row; k < 8
    {64, 10, 1024, 32, 8},   // k > 8: the slot sum takes two batches
};

struct BaselineCase {
  RoutingCase routing;
  int shape;  // index into kShapes
};

std::string name_of(const BaselineCase& c) {
  return std::string(name_of(c.routing)) + "_shape" + std::to_string(c.shape);
}

std::string case_name(const testing::TestParamInfo<BaselineCase>& info) { return name_of(info.param); }

void PrintTo(const BaselineCase& c, std::ostream* os) { *os << name_of(c); }

std::vector<BaselineCase> baseline_cases() {
  std::vector<BaselineCase> cases;
  for (const NamedRoutingCase& named : kRoutingCases) {
    for (int shape : {0, 1}) cases.push_back({named.routing, shape});
  }
  return cases;
}

class NcclBaseline : public testing::TestWithParam<BaselineCase> {};

TEST_P(NcclBaseline, MatchesTokenExchangeAtW1) {
  CARACAL_REQUIRE_GPU();
  const ExchangeShape& shape = kShapes[GetParam().shape];
  const int64_t T = shape.tokens;
  const int64_t D = shape.hidden;
  const int64_t routes = T * shape.top_k;
  const int64_t L = shape.num_experts;  // W = 1: every expert is local
  const ExchangeOptions forward_only{true, false, false};
  comm::LoopbackWorld world(1, TokenExchange::heap_bytes(shape, 1, forward_only));
  TokenExchange ex(world, shape, forward_only);
  std::vector<comm::NcclComm> comms = comm::init_all({0});
  bench::NcclBaselineExchange baseline(comms[0].get(), shape);
  auto baseline_out = comm::device_alloc<__nv_bfloat16>(static_cast<size_t>(routes * D), "cudaMalloc(expert_out)");
  auto baseline_y = comm::device_alloc<__nv_bfloat16>(static_cast<size_t>(T * D), "cudaMalloc(y)");
  const RouterNormalization router{true, 2.5};
  Stream stream;

  for (int step = 0; step < 2; ++step) {
    const uint64_t seed = fresh_seed();
    SCOPED_TRACE(seed_note(seed));
    std::mt19937_64 rng(seed);
    const Routing routing = make_test_routing(GetParam().routing, 1, T, shape.top_k, shape.num_experts, seed);
    std::uniform_real_distribution<float> score(0.05f, 1.0f);
    std::vector<float> scores(static_cast<size_t>(routes));
    for (float& s : scores) s = score(rng);
    upload(world, ex.schedule_buffers().topk_idx, 0, routing.topk_idx);
    upload(world, ex.router_buffers().topk_scores, 0, scores);
    upload(world, ex.forward_buffers().x, 0, random_rows(T * D, rng));
    poison(world, ex.forward_buffers().y, 0, T * D, kNanByte);
    check_cuda(cudaMemset(baseline_y.get(), kNanByte, static_cast<size_t>(T * D) * sizeof(uint16_t)),
               "cudaMemset(poison)");
    settle();

    // Dispatch: TokenExchange's expert_x and the baseline's, expert by expert.
    ex.build_schedule(router, stream.get());
    ex.dispatch(stream.get());
    baseline.dispatch(world.local_pointer(ex.schedule_buffers().topk_idx), world.local_pointer(ex.forward_buffers().x),
                      stream.get());
    stream.sync();
    ASSERT_NO_THROW(ex.check());
    const auto offset = download<int32_t>(world, ex.schedule_buffers().expert_offset, 0, L + 1);
    const auto count = download<int32_t>(world, ex.schedule_buffers().expert_count, 0, L);
    const Bf16Rows ours = download<uint16_t>(world, ex.forward_buffers().expert_x, 0, offset.back() * D);
    ASSERT_EQ(baseline.expert_rows().size(), static_cast<size_t>(L));
    Bf16Rows theirs(static_cast<size_t>(baseline.received_rows() * D));
    check_cuda(cudaMemcpy(theirs.data(), baseline.expert_x(), theirs.size() * sizeof(uint16_t), cudaMemcpyDeviceToHost),
               "cudaMemcpy(baseline expert_x)");
    int64_t base = 0;
    for (int64_t l = 0; l < L; ++l) {
      const int64_t n = baseline.expert_rows()[static_cast<size_t>(l)];
      ASSERT_EQ(n, count[static_cast<size_t>(l)]) << "rows of expert " << l;
      expect_same_bits(rows_of(theirs, base, n, D), rows_of(ours, offset[static_cast<size_t>(l)], n, D),
                       "expert " + std::to_string(l) + " rows");
      base += n;
    }
    ASSERT_EQ(base, baseline.received_rows());

    // Combine: the same expert outputs (NaN in TokenExchange's padding rows, which must not
    // travel), in each exchange's row order; y bit for bit.
    Bf16Rows expert_out(ours.size(), kBf16Nan);
    Bf16Rows baseline_rows;
    for (int64_t l = 0; l < L; ++l) {
      const Bf16Rows values = random_rows(count[static_cast<size_t>(l)] * D, rng);
      std::copy(values.begin(), values.end(), expert_out.begin() + offset[static_cast<size_t>(l)] * D);
      baseline_rows.insert(baseline_rows.end(), values.begin(), values.end());
    }
    upload(world, ex.forward_buffers().expert_out, 0, expert_out);
    check_cuda(cudaMemcpy(baseline_out.get(), baseline_rows.data(), baseline_rows.size() * sizeof(uint16_t),
                          cudaMemcpyHostToDevice),
               "cudaMemcpy(baseline expert_out)");
    settle();
    ex.combine(router, stream.get());
    baseline.combine(baseline_out.get(), world.local_pointer(ex.router_buffers().gates), baseline_y.get(),
                     stream.get());
    stream.sync();
    ASSERT_NO_THROW(ex.check());
    Bf16Rows baseline_y_host(static_cast<size_t>(T * D));
    check_cuda(cudaMemcpy(baseline_y_host.data(), baseline_y.get(), baseline_y_host.size() * sizeof(uint16_t),
                          cudaMemcpyDeviceToHost),
               "cudaMemcpy(baseline y)");
    expect_same_bits(baseline_y_host, download<uint16_t>(world, ex.forward_buffers().y, 0, T * D), "y (combine)");
  }
}

INSTANTIATE_TEST_SUITE_P(W1, NcclBaseline, testing::ValuesIn(baseline_cases()), case_name);

}  // namespace
}  // namespace caracal::exchange_test
