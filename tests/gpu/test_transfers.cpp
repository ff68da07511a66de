// The four token transfers (and the router gates) against a CPU twin of the data movement, bit for
// bit, in loopback at W = 1, 2, 4, 8 on random and adversarial routings: every output is poisoned
// first, every input is fresh random data, expert-side rows that carry no route hold NaN (so a
// padding row that travels shows up), and the whole sequence is also replayed from a CUDA graph
// with new routing and new inputs each time.
//
// The twin performs the device's float operations in the same order (std::fma where the device
// uses __fmaf_rn, plain + - * / where it uses __fadd_rn and friends; built with -ffp-contract=off).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "caracal/bf16.hpp"
#include "caracal/combine_groups.hpp"
#include "caracal/comm/loopback_world.hpp"
#include "caracal/error.hpp"
#include "caracal/layer_config.hpp"
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

using Bf16Rows = std::vector<uint16_t>;  // bf16 bits, row-major
constexpr uint16_t kBf16Nan = 0xFFFF;

// ---- Inputs ---------------------------------------------------------------------------------------

// Every rank's inputs. Expert-side rows (R = row capacity) hold random values where the schedule
// has a route and NaN everywhere else.
struct Inputs {
  std::vector<std::vector<float>> scores;              // [W][T*k]
  std::vector<Bf16Rows> x, dy, shared_out, shared_dx;  // [W][T*D]
  std::vector<Bf16Rows> expert_out, expert_dx;         // [W][R*D]
  std::vector<std::vector<float>> expert_dg;           // [W][R]
};

Bf16Rows random_rows(int64_t count, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> value(-4.0f, 4.0f);
  Bf16Rows rows(static_cast<size_t>(count));
  for (uint16_t& v : rows) v = bf16_bits(value(rng));
  return rows;
}

Inputs make_inputs(const ExchangeShape& shape, int64_t capacity, const Schedule& schedule, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> score(0.05f, 1.0f);
  std::uniform_real_distribution<float> dg(-1.0f, 1.0f);
  const int64_t T = shape.tokens;
  const int64_t D = shape.hidden;
  Inputs in;
  for (const RankSchedule& rs : schedule.ranks) {
    std::vector<float> scores(static_cast<size_t>(T * shape.top_k));
    for (float& s : scores) s = score(rng);
    in.scores.push_back(scores);
    in.x.push_back(random_rows(T * D, rng));
    in.dy.push_back(random_rows(T * D, rng));
    in.shared_out.push_back(random_rows(T * D, rng));
    in.shared_dx.push_back(random_rows(T * D, rng));
    Bf16Rows out(static_cast<size_t>(capacity * D), kBf16Nan);
    Bf16Rows dx(static_cast<size_t>(capacity * D), kBf16Nan);
    std::vector<float> dgs(static_cast<size_t>(capacity), std::nanf(""));
    for (size_t row = 0; row < rs.rows.size(); ++row) {
      if (rs.rows[row].is_padding()) continue;
      const Bf16Rows a = random_rows(D, rng);
      const Bf16Rows b = random_rows(D, rng);
      std::copy(a.begin(), a.end(), out.begin() + static_cast<int64_t>(row) * D);
      std::copy(b.begin(), b.end(), dx.begin() + static_cast<int64_t>(row) * D);
      dgs[row] = dg(rng);
    }
    in.expert_out.push_back(out);
    in.expert_dx.push_back(dx);
    in.expert_dg.push_back(dgs);
  }
  return in;
}

// ---- The CPU twin -----------------------------------------------------------------------------------

struct Expected {
  std::vector<std::vector<float>> gates, expert_gates, d_scores;
  std::vector<Bf16Rows> expert_x, y, expert_dy, dx;  // expert_x / expert_dy: [padded rows][D]
};

struct Twin {
  const ExchangeShape& shape;
  const Routing& routing;
  const Schedule& schedule;
  const Inputs& in;
  float scale;
  bool normalize;
  bool shared;
  int combine_group_rows;  // combine's group window (0: the whole schedule)
  bool per_route;          // ExchangeOptions::rows_per_route

  bool routed(int32_t id) const { return id >= 0 && id < shape.num_experts; }

  std::vector<float> gates_of(int64_t rank) const {
    const int64_t k = shape.top_k;
    std::vector<float> gates(static_cast<size_t>(shape.tokens * k));
    for (int64_t t = 0; t < shape.tokens; ++t) {
      const float* s = in.scores[static_cast<size_t>(rank)].data() + t * k;
      float factor = scale;
      if (normalize) {
        float sum = 0.0f;
        for (int64_t j = 0; j < k; ++j) {
          if (routed(routing.at(rank, t, j))) sum = sum + s[j];
        }
        factor = sum != 0.0f ? scale / sum : 0.0f;
      }
      for (int64_t j = 0; j < k; ++j) {
        gates[static_cast<size_t>(t * k + j)] = routed(routing.at(rank, t, j)) ? factor * s[j] : 0.0f;
      }
    }
    return gates;
  }

  // Expert side of a pull: each schedule row's home token row (zero for padding).
  Bf16Rows pulled(int64_t rank, const std::vector<Bf16Rows>& home_rows) const {
    const int64_t D = shape.hidden;
    const std::vector<ScheduleRow>& rows = schedule.ranks[static_cast<size_t>(rank)].rows;
    Bf16Rows out(rows.size() * static_cast<size_t>(D), 0);
    for (size_t row = 0; row < rows.size(); ++row) {
      if (rows[row].is_padding()) continue;
      const uint16_t* src = home_rows[static_cast<size_t>(rows[row].src_rank)].data() +
                            static_cast<int64_t>(rows[row].src_route / shape.top_k) * D;
      std::copy(src, src + D, out.begin() + static_cast<int64_t>(row) * D);
    }
    return out;
  }

  // y: combine per (token, rank) (caracal/combine_groups.hpp) of the expert rows that processed
  // the token's slots.
  Bf16Rows combined(int64_t rank, const std::vector<float>& gates) const {
    const int64_t D = shape.hidden;
    const int64_t k = shape.top_k;
    const std::vector<RouteLocation>& where = schedule.routes[static_cast<size_t>(rank)];
    Bf16Rows out(static_cast<size_t>(shape.tokens * D));
    for (int64_t t = 0; t < shape.tokens; ++t) {
      std::vector<SlotPlace> slots(static_cast<size_t>(k));
      std::vector<const uint16_t*> rows(static_cast<size_t>(k), nullptr);
      for (int64_t j = 0; j < k; ++j) {
        if (!routed(routing.at(rank, t, j))) continue;
        const RouteLocation loc = where[static_cast<size_t>(t * k + j)];
        slots[static_cast<size_t>(j)] = {true, static_cast<int>(loc.dst_rank), static_cast<int>(loc.row)};
        rows[static_cast<size_t>(j)] =
            in.expert_out[static_cast<size_t>(loc.dst_rank)].data() + static_cast<int64_t>(loc.row) * D;
      }
      const std::vector<float> token_gates(gates.begin() + t * k, gates.begin() + (t + 1) * k);
      const Bf16Rows row = combine_token_row(
          slots, token_gates, rows, shared ? in.shared_out[static_cast<size_t>(rank)].data() + t * D : nullptr, D,
          combine_group_rows, per_route);
      std::copy(row.begin(), row.end(), out.begin() + t * D);
    }
    return out;
  }

  // dx: shared + the sum over routed slots of the expert row that processed the slot.
  Bf16Rows reduced(int64_t rank, const std::vector<Bf16Rows>& expert_rows, const Bf16Rows& shared_rows) const {
    const int64_t D = shape.hidden;
    const int64_t k = shape.top_k;
    const std::vector<RouteLocation>& where = schedule.routes[static_cast<size_t>(rank)];
    Bf16Rows out(static_cast<size_t>(shape.tokens * D));
    for (int64_t t = 0; t < shape.tokens; ++t) {
      for (int64_t d = 0; d < D; ++d) {
        float acc = shared ? bf16_to_float(shared_rows[static_cast<size_t>(t * D + d)]) : 0.0f;
        for (int64_t j = 0; j < k; ++j) {
          if (!routed(routing.at(rank, t, j))) continue;
          const RouteLocation loc = where[static_cast<size_t>(t * k + j)];
          const float v = bf16_to_float(expert_rows[static_cast<size_t>(loc.dst_rank)]
                                                   [static_cast<size_t>(static_cast<int64_t>(loc.row) * D + d)]);
          acc = acc + v;
        }
        out[static_cast<size_t>(t * D + d)] = bf16_bits(acc);
      }
    }
    return out;
  }

  std::vector<float> score_gradients_of(int64_t rank) const {
    const int64_t k = shape.top_k;
    const std::vector<RouteLocation>& where = schedule.routes[static_cast<size_t>(rank)];
    std::vector<float> out(static_cast<size_t>(shape.tokens * k));
    for (int64_t t = 0; t < shape.tokens; ++t) {
      const float* s = in.scores[static_cast<size_t>(rank)].data() + t * k;
      std::vector<float> dg(static_cast<size_t>(k), 0.0f);
      for (int64_t j = 0; j < k; ++j) {
        if (!routed(routing.at(rank, t, j))) continue;
        const RouteLocation loc = where[static_cast<size_t>(t * k + j)];
        dg[static_cast<size_t>(j)] = in.expert_dg[static_cast<size_t>(loc.dst_rank)][static_cast<size_t>(loc.row)];
      }
      float factor = scale;
      float mean = 0.0f;
      if (normalize) {
        float sum = 0.0f;
        float weighted = 0.0f;
        for (int64_t j = 0; j < k; ++j) {
          if (!routed(routing.at(rank, t, j))) continue;
          sum = sum + s[j];
          weighted = std::fma(dg[static_cast<size_t>(j)], s[j], weighted);
        }
        factor = sum != 0.0f ? scale / sum : 0.0f;
        mean = sum != 0.0f ? weighted / sum : 0.0f;
      }
      for (int64_t j = 0; j < k; ++j) {
        float d = 0.0f;
        if (routed(routing.at(rank, t, j))) {
          const float g = dg[static_cast<size_t>(j)];
          d = normalize ? factor * (g - mean) : scale * g;
        }
        out[static_cast<size_t>(t * k + j)] = d;
      }
    }
    return out;
  }

  Expected run() const {
    Expected e;
    const int64_t W = routing.world_size;
    for (int64_t r = 0; r < W; ++r) e.gates.push_back(gates_of(r));
    for (int64_t r = 0; r < W; ++r) {
      const std::vector<ScheduleRow>& rows = schedule.ranks[static_cast<size_t>(r)].rows;
      std::vector<float> g(rows.size(), 0.0f);
      for (size_t row = 0; row < rows.size(); ++row) {
        if (!rows[row].is_padding()) {
          g[row] = e.gates[static_cast<size_t>(rows[row].src_rank)][static_cast<size_t>(rows[row].src_route)];
        }
      }
      e.expert_gates.push_back(g);
      e.expert_x.push_back(pulled(r, in.x));
      e.expert_dy.push_back(pulled(r, in.dy));
      e.y.push_back(combined(r, e.gates[static_cast<size_t>(r)]));
      e.dx.push_back(reduced(r, in.expert_dx, in.shared_dx[static_cast<size_t>(r)]));
      e.d_scores.push_back(score_gradients_of(r));
    }
    return e;
  }
};

// ---- Running the exchange -------------------------------------------------------------------------

void upload_step(const TokenExchange& ex, const Routing& routing, const Inputs& in) {
  const comm::World& world = ex.world();
  const int64_t routes = ex.sizes().routes;
  for (int l = 0; l < world.local_ranks(); ++l) {
    const size_t rank = static_cast<size_t>(world.first_local_rank() + l);
    const int32_t* ids = routing.rank_topk(static_cast<int64_t>(rank));
    upload(world, ex.schedule_buffers().topk_idx, l, std::vector<int32_t>(ids, ids + routes));
    upload(world, ex.router_buffers().topk_scores, l, in.scores[rank]);
    upload(world, ex.forward_buffers().x, l, in.x[rank]);
    upload(world, ex.forward_buffers().expert_out, l, in.expert_out[rank]);
    upload(world, ex.backward_buffers().dy, l, in.dy[rank]);
    upload(world, ex.backward_buffers().expert_dx, l, in.expert_dx[rank]);
    upload(world, ex.backward_buffers().expert_dg, l, in.expert_dg[rank]);
    if (ex.options().shared_expert) {
      upload(world, ex.forward_buffers().shared_out, l, in.shared_out[rank]);
      upload(world, ex.backward_buffers().shared_dx, l, in.shared_dx[rank]);
    }
  }
}

// NaN into every output and every buffer written by peers.
void poison_outputs(const TokenExchange& ex) {
  const comm::World& world = ex.world();
  const int64_t R = ex.sizes().row_capacity, routes = ex.sizes().routes, T = ex.shape().tokens, D = ex.shape().hidden;
  for (int l = 0; l < world.local_ranks(); ++l) {
    poison(world, ex.router_buffers().gates, l, routes, kNanByte);
    poison(world, ex.router_buffers().d_topk_scores, l, routes, kNanByte);
    poison(world, ex.forward_buffers().expert_x, l, R * D, kNanByte);
    poison(world, ex.forward_buffers().combine_slots, l, routes * D, kNanByte);
    poison(world, ex.forward_buffers().y, l, T * D, kNanByte);
    poison(world, ex.backward_buffers().expert_dy, l, R * D, kNanByte);
    poison(world, ex.backward_buffers().expert_gates, l, R, kNanByte);
    poison(world, ex.backward_buffers().dx_slots, l, routes * D, kNanByte);
    poison(world, ex.backward_buffers().dg_slots, l, routes, kNanByte);
    poison(world, ex.backward_buffers().dx, l, T * D, kNanByte);
  }
}

void enqueue_step(TokenExchange& ex, const RouterNormalization& router, cudaStream_t stream, int combine_group_rows = 0) {
  ex.build_schedule(router, stream);
  ex.dispatch(stream);
  ex.combine(router, stream, combine_group_rows);
  ex.reverse_combine(stream);
  ex.reverse_dispatch(router, stream);
}

// Rows [0, rows) of a [capacity][width] download, after checking that the rest is still poison
// (all bytes kNanByte): nothing past the schedule's rows is written.
template <typename T>
std::vector<T> used_rows(const std::vector<T>& all, int64_t rows, int64_t width, const std::string& what) {
  T poisoned;
  std::memset(&poisoned, kNanByte, sizeof(T));
  for (size_t i = static_cast<size_t>(rows * width); i < all.size(); ++i) {
    if (bits_of(all[i]) != bits_of(poisoned)) {
      ADD_FAILURE() << what << ": element " << i << " past the schedule's rows was written";
      break;
    }
  }
  return std::vector<T>(all.begin(), all.begin() + rows * width);
}

void expect_outputs(const TokenExchange& ex, const Expected& want, const Schedule& schedule) {
  const comm::World& world = ex.world();
  const int64_t R = ex.sizes().row_capacity, routes = ex.sizes().routes, T = ex.shape().tokens, D = ex.shape().hidden;
  for (int l = 0; l < world.local_ranks(); ++l) {
    const size_t rank = static_cast<size_t>(world.first_local_rank() + l);
    SCOPED_TRACE("rank " + std::to_string(rank));
    const int64_t rows = schedule.ranks[rank].padded_rows();
    expect_same_bits(download<float>(world, ex.router_buffers().gates, l, routes), want.gates[rank], "gates");
    expect_same_bits(used_rows(download<uint16_t>(world, ex.forward_buffers().expert_x, l, R * D), rows, D, "expert_x"),
                     want.expert_x[rank], "expert_x (dispatch)");
    expect_same_bits(download<uint16_t>(world, ex.forward_buffers().y, l, T * D), want.y[rank], "y (combine)");
    expect_same_bits(
        used_rows(download<uint16_t>(world, ex.backward_buffers().expert_dy, l, R * D), rows, D, "expert_dy"),
        want.expert_dy[rank], "expert_dy (reverse combine)");
    expect_same_bits(
        used_rows(download<float>(world, ex.backward_buffers().expert_gates, l, R), rows, 1, "expert_gates"),
        want.expert_gates[rank], "expert_gates (reverse combine)");
    expect_same_bits(download<uint16_t>(world, ex.backward_buffers().dx, l, T * D), want.dx[rank],
                     "dx (reverse dispatch)");
    expect_same_bits(download<float>(world, ex.router_buffers().d_topk_scores, l, routes), want.d_scores[rank],
                     "d_topk_scores (reverse dispatch)");
  }
}

// One step with fresh inputs for `routing`, launched by `launch` (directly or from a graph).
template <typename Launch>
void run_and_check(TokenExchange& ex, const Routing& routing, const RouterNormalization& router, uint64_t seed,
                   Launch launch, int combine_group_rows = 0) {
  const ExchangeShape& shape = ex.shape();
  const Schedule schedule = build_schedule(routing, shape.num_experts, shape.tile_m);
  const Inputs in = make_inputs(shape, ex.sizes().row_capacity, schedule, seed);
  upload_step(ex, routing, in);
  poison_outputs(ex);
  settle();
  launch();
  ASSERT_NO_THROW(ex.check());
  const Twin twin{shape,
                  routing,
                  schedule,
                  in,
                  static_cast<float>(router.scale),
                  router.normalize,
                  ex.options().shared_expert,
                  combine_group_rows,
                  ex.options().rows_per_route};
  expect_outputs(ex, twin.run(), schedule);
}

// ---- Loopback sweep ---------------------------------------------------------------------------------

const ExchangeShape kShapes[] = {
    {200, 6, 200, 16, 128},  // 25 vectors per row: the copy's remainder loop; k < kSlotsInFlight
    {64, 10, 1024, 32, 8},   // 128 vectors: whole unrolled batches; k > kSlotsInFlight; small tiles
    {40, 36, 72, 48, 8},     // k > 32: a token's group of rows on a rank is read in two rounds of slots
};

struct TransferCase {
  int world;
  RoutingCase routing;
  int shape;    // index into kShapes
  bool shared;  // shared expert rows added on the home side
  bool normalize;
};

std::string name_of(const TransferCase& c) {
  return "W" + std::to_string(c.world) + "_" + name_of(c.routing) + "_shape" + std::to_string(c.shape) +
         (c.shared ? "_shared" : "_noshared") + (c.normalize ? "_normalized" : "_scaled");
}

std::string case_name(const testing::TestParamInfo<TransferCase>& info) { return name_of(info.param); }

void PrintTo(const TransferCase& c, std::ostream* os) { *os << name_of(c); }

std::vector<TransferCase> transfer_cases() {
  std::vector<TransferCase> cases;
  for (const auto& [world, routing] : loopback_sweep()) {
    for (int shape : {0, 1}) {
      cases.push_back({world, routing, shape, true, true});
      cases.push_back({world, routing, shape, false, false});
    }
  }
  for (int world : {1, 2}) {
    for (RoutingCase routing : {RoutingCase::kUniform, RoutingCase::kDuplicates, RoutingCase::kAllToOne}) {
      cases.push_back({world, routing, 2, true, true});
    }
  }
  return cases;
}

RouterNormalization router_of(bool normalize) {
  return normalize ? RouterNormalization{true, 1.0} : RouterNormalization{false, 2.5};
}

class GpuTransfers : public testing::TestWithParam<TransferCase> {};

TEST_P(GpuTransfers, MatchCpuTwinBitForBit) {
  CARACAL_REQUIRE_GPU();
  const TransferCase& c = GetParam();
  const ExchangeShape& shape = kShapes[c.shape];
  const ExchangeOptions options{true, true, c.shared};
  comm::LoopbackWorld world(c.world, TokenExchange::heap_bytes(shape, c.world, options));
  TokenExchange ex(world, shape, options);
  Stream stream;
  const RouterNormalization router = router_of(c.normalize);
  // The second step reuses every buffer with new data, and sums combine's groups within windows of
  // two tiles of rows (as the fused forward's macrobatches).
  for (int step = 0; step < 2; ++step) {
    const uint64_t seed = fresh_seed();
    const int group_rows = step == 0 ? 0 : 2 * static_cast<int>(shape.tile_m);
    SCOPED_TRACE(seed_note(seed) + ", combine's group rows " + std::to_string(group_rows));
    const Routing routing = make_test_routing(c.routing, c.world, shape.tokens, shape.top_k, shape.num_experts, seed);
    run_and_check(
        ex, routing, router, seed,
        [&] {
          enqueue_step(ex, router, stream.get(), group_rows);
          stream.sync();
        },
        group_rows);
  }
}

INSTANTIATE_TEST_SUITE_P(Loopback, GpuTransfers, testing::ValuesIn(transfer_cases()), case_name);

// ExchangeOptions::rows_per_route (a row per route both ways, as v1 moved rows): pulls of the same
// bits, combine's groups of one route each.
TEST(GpuTransfersPerRoute, MatchCpuTwinBitForBit) {
  CARACAL_REQUIRE_GPU();
  for (int world_size : {1, 2, 4}) {
    for (RoutingCase routing_case : {RoutingCase::kUniform, RoutingCase::kDuplicates}) {
      SCOPED_TRACE("W" + std::to_string(world_size) + "_" + name_of(routing_case));
      const ExchangeShape& shape = kShapes[0];
      ExchangeOptions options{true, true, true};
      options.rows_per_route = true;
      comm::LoopbackWorld world(world_size, TokenExchange::heap_bytes(shape, world_size, options));
      TokenExchange ex(world, shape, options);
      Stream stream;
      const RouterNormalization router = router_of(true);
      const uint64_t seed = fresh_seed();
      SCOPED_TRACE(seed_note(seed));
      const Routing routing =
          make_test_routing(routing_case, world_size, shape.tokens, shape.top_k, shape.num_experts, seed);
      run_and_check(ex, routing, router, seed, [&] {
        enqueue_step(ex, router, stream.get());
        stream.sync();
      });
    }
  }
}

// combine_after_fused_forward: the groups of macrobatch 0 (schedule rows [0, ring)) summed from
// expert_dy's rows, those of later macrobatches read from the slots where the fused forward left
// their sums (here the twin's, written by the test); y is the twin's with windows of `ring` rows,
// bit for bit, in one pass (W = 1, single_rank_combine.cuh) and in two (W = 2).
TEST(GpuTransfersAfterFusedForward, SumsMacrobatchZeroAndReadsLaterGroupsFromTheirSlots) {
  CARACAL_REQUIRE_GPU();
  for (int world_size : {1, 2}) {
    for (bool shared : {true, false}) {
      SCOPED_TRACE("W" + std::to_string(world_size) + (shared ? "_shared" : "_noshared"));
      const ExchangeShape& shape = kShapes[0];
      const int64_t T = shape.tokens, k = shape.top_k, D = shape.hidden, ring = shape.tile_m;
      const ExchangeOptions options{true, true, shared};
      comm::LoopbackWorld world(world_size, TokenExchange::heap_bytes(shape, world_size, options));
      TokenExchange ex(world, shape, options);
      Stream stream;
      const RouterNormalization router = router_of(true);
      const uint64_t seed = fresh_seed();
      SCOPED_TRACE(seed_note(seed));
      const Routing routing =
          make_test_routing(RoutingCase::kUniform, world_size, T, k, shape.num_experts, seed);
      const Schedule schedule = build_schedule(routing, shape.num_experts, shape.tile_m);
      const Inputs in = make_inputs(shape, ex.sizes().row_capacity, schedule, seed);
      upload_step(ex, routing, in);
      poison_outputs(ex);
      const Twin twin{shape, routing, schedule, in, static_cast<float>(router.scale), router.normalize, shared,
                      static_cast<int>(ring), false};
      for (int l = 0; l < world.local_ranks(); ++l) {
        const size_t rank = static_cast<size_t>(world.first_local_rank() + l);
        ASSERT_GT(schedule.ranks[rank].padded_rows(), 2 * ring) << "the routing must fill several macrobatches";
        // Macrobatch 0's expert outputs wait in expert_dy's first ring rows.
        upload(world, ex.backward_buffers().expert_dy, l,
               Bf16Rows(in.expert_out[rank].begin(), in.expert_out[rank].begin() + ring * D));
      }
      // The home slots of the groups led from later macrobatches: each group's sum alone (its
      // members' places, the others unrouted, no shared row: one rounding of the group's sum).
      for (int l = 0; l < world.local_ranks(); ++l) {
        const size_t home = static_cast<size_t>(world.first_local_rank() + l);
        const std::vector<float> gates = twin.gates_of(static_cast<int64_t>(home));
        Bf16Rows slots(static_cast<size_t>(T * k * D), kBf16Nan);
        for (int64_t t = 0; t < T; ++t) {
          std::vector<SlotPlace> places(static_cast<size_t>(k));
          std::vector<const uint16_t*> rows(static_cast<size_t>(k), nullptr);
          for (int64_t j = 0; j < k; ++j) {
            if (!twin.routed(routing.at(static_cast<int64_t>(home), t, j))) continue;
            const RouteLocation loc = schedule.routes[home][static_cast<size_t>(t * k + j)];
            places[static_cast<size_t>(j)] = {true, static_cast<int>(loc.dst_rank), static_cast<int>(loc.row)};
            rows[static_cast<size_t>(j)] = in.expert_out[static_cast<size_t>(loc.dst_rank)].data() + loc.row * D;
          }
          const std::vector<int> leaders = combine_group_leaders(places, static_cast<int>(ring), false);
          for (int64_t j = 0; j < k; ++j) {
            if (leaders[static_cast<size_t>(j)] != j || places[static_cast<size_t>(j)].row < ring) continue;
            std::vector<SlotPlace> group(static_cast<size_t>(k));
            for (int64_t i = 0; i < k; ++i) {
              if (leaders[static_cast<size_t>(i)] == j) group[static_cast<size_t>(i)] = places[static_cast<size_t>(i)];
            }
            const std::vector<float> token_gates(gates.begin() + t * k, gates.begin() + (t + 1) * k);
            const Bf16Rows sum = combine_token_row(group, token_gates, rows, nullptr, D, static_cast<int>(ring), false);
            std::copy(sum.begin(), sum.end(), slots.begin() + (t * k + j) * D);
          }
        }
        upload(world, ex.forward_buffers().combine_slots, l, slots);
      }
      settle();
      ex.build_schedule(router, stream.get());
      ex.combine_after_fused_forward(router, static_cast<int>(ring), stream.get());
      stream.sync();
      ASSERT_NO_THROW(ex.check());
      for (int l = 0; l < world.local_ranks(); ++l) {
        const size_t rank = static_cast<size_t>(world.first_local_rank() + l);
        expect_same_bits(download<uint16_t>(world, ex.forward_buffers().y, l, T * D),
                         twin.combined(static_cast<int64_t>(rank), twin.gates_of(static_cast<int64_t>(rank))),
                         "y, rank " + std::to_string(rank));
      }
    }
  }
}

// Pulls window by window over a ring, as the fused backward's: each window's rows land in the
// ring's first rows (dispatch: x; reverse combine: dy, and g per schedule row), padding zeroed, no
// row past the window written; with RowsInPlace::kAll dispatch zeroes only the padding and leaves
// the real rows as they were. Bit for bit against the twin, in a world of one rank (by token,
// single_rank_pull.cuh) and of two (by schedule row, pull_rows.cuh).
TEST(GpuTransfersWindows, PullEachWindowIntoTheRing) {
  CARACAL_REQUIRE_GPU();
  for (int world_size : {1, 2}) {
    SCOPED_TRACE("W" + std::to_string(world_size));
    const ExchangeShape& shape = kShapes[0];
    const int64_t T = shape.tokens, k = shape.top_k, D = shape.hidden, ring = 2 * shape.tile_m;
    ExchangeOptions options{true, true, false};
    options.expert_out = false;
    options.expert_dx = false;
    options.ring_rows = static_cast<int>(ring);
    comm::LoopbackWorld world(world_size, TokenExchange::heap_bytes(shape, world_size, options));
    TokenExchange ex(world, shape, options);
    Stream stream;
    const RouterNormalization router = router_of(true);
    const uint64_t seed = fresh_seed();
    SCOPED_TRACE(seed_note(seed));
    const Routing routing = make_test_routing(RoutingCase::kZipf, world_size, T, k, shape.num_experts, seed);
    const Schedule schedule = build_schedule(routing, shape.num_experts, shape.tile_m);
    const Inputs in = make_inputs(shape, ex.sizes().row_capacity, schedule, seed);
    int64_t most_rows = 0;
    for (int l = 0; l < world.local_ranks(); ++l) {
      const size_t rank = static_cast<size_t>(world.first_local_rank() + l);
      const int32_t* ids = routing.rank_topk(static_cast<int64_t>(rank));
      upload(world, ex.schedule_buffers().topk_idx, l, std::vector<int32_t>(ids, ids + T * k));
      upload(world, ex.router_buffers().topk_scores, l, in.scores[rank]);
      upload(world, ex.forward_buffers().x, l, in.x[rank]);
      upload(world, ex.backward_buffers().dy, l, in.dy[rank]);
      most_rows = std::max(most_rows, schedule.ranks[rank].padded_rows());
    }
    ASSERT_GT(most_rows, 2 * ring) << "the routing must fill several windows";
    const Twin twin{shape, routing, schedule, in, static_cast<float>(router.scale), router.normalize, false, 0, false};
    const Expected want = twin.run();
    settle();
    ex.build_schedule(router, stream.get());
    stream.sync();
    const int64_t R = ex.sizes().row_capacity;
    for (int64_t first = 0; first < most_rows; first += ring) {
      const int end = static_cast<int>(std::min(first + ring, static_cast<int64_t>(ex.schedule_view(0).row_capacity)));
      SCOPED_TRACE("window [" + std::to_string(first) + ", " + std::to_string(end) + ")");
      for (int l = 0; l < world.local_ranks(); ++l) {
        poison(world, ex.forward_buffers().expert_x, l, ring * D, kNanByte);
        poison(world, ex.backward_buffers().expert_dy, l, ring * D, kNanByte);
        poison(world, ex.backward_buffers().expert_gates, l, R, kNanByte);
      }
      settle();
      ex.dispatch(stream.get(), {static_cast<int>(first), end});
      ex.reverse_combine(stream.get(), {static_cast<int>(first), end});
      stream.sync();
      ASSERT_NO_THROW(ex.check());
      for (int l = 0; l < world.local_ranks(); ++l) {
        const size_t rank = static_cast<size_t>(world.first_local_rank() + l);
        const int64_t rows = std::clamp(schedule.ranks[rank].padded_rows() - first, int64_t{0}, ring);
        const auto window_of = [&](const Bf16Rows& all) {
          return Bf16Rows(all.begin() + first * D, all.begin() + (first + rows) * D);
        };
        expect_same_bits(used_rows(download<uint16_t>(world, ex.forward_buffers().expert_x, l, ring * D), rows, D,
                                   "expert_x"),
                         window_of(want.expert_x[rank]), "expert_x, rank " + std::to_string(rank));
        expect_same_bits(used_rows(download<uint16_t>(world, ex.backward_buffers().expert_dy, l, ring * D), rows, D,
                                   "expert_dy"),
                         window_of(want.expert_dy[rank]), "expert_dy, rank " + std::to_string(rank));
        const std::vector<float> gates = download<float>(world, ex.backward_buffers().expert_gates, l, R);
        expect_same_bits(std::vector<float>(gates.begin() + first, gates.begin() + first + rows),
                         std::vector<float>(want.expert_gates[rank].begin() + first,
                                            want.expert_gates[rank].begin() + first + rows),
                         "expert_gates, rank " + std::to_string(rank));
      }
      // Rows in place: only the padding is written (zero); the real rows keep their poison.
      for (int l = 0; l < world.local_ranks(); ++l) poison(world, ex.forward_buffers().expert_x, l, ring * D, kNanByte);
      settle();
      transfer::PullRange in_place{static_cast<int>(first), end};
      in_place.in_place = transfer::RowsInPlace::kAll;
      ex.dispatch(stream.get(), in_place);
      stream.sync();
      for (int l = 0; l < world.local_ranks(); ++l) {
        const size_t rank = static_cast<size_t>(world.first_local_rank() + l);
        const int64_t rows = std::clamp(schedule.ranks[rank].padded_rows() - first, int64_t{0}, ring);
        const Bf16Rows got = download<uint16_t>(world, ex.forward_buffers().expert_x, l, ring * D);
        int64_t wrong = 0;
        for (int64_t r = 0; r < rows; ++r) {
          const bool padding = schedule.ranks[rank].rows[static_cast<size_t>(first + r)].is_padding();
          for (int64_t d = 0; d < D; ++d) {
            wrong += got[static_cast<size_t>(r * D + d)] != (padding ? uint16_t{0} : kBf16Nan);
          }
        }
        EXPECT_EQ(wrong, 0) << "rank " << rank << ": values of a dispatch with every row in place";
      }
    }
  }
}

// reverse_dispatch_filled_dx_slots: the dx rows already in their home slots (as the dx GEMM stores
// them; here written by the test), only dL/dg pushed: dx and d topk_scores bit for bit as the twin
// computes them, in a world of one rank (one pass) and of two.
TEST(GpuTransfersFilledDxSlots, SumsTheSlotsAndPushesOnlyDg) {
  CARACAL_REQUIRE_GPU();
  for (int world_size : {1, 2}) {
    for (bool shared : {true, false}) {
      SCOPED_TRACE("W" + std::to_string(world_size) + (shared ? "_shared" : "_noshared"));
      const ExchangeShape& shape = kShapes[0];
      const int64_t T = shape.tokens, k = shape.top_k, D = shape.hidden;
      const ExchangeOptions options{true, true, shared};
      comm::LoopbackWorld world(world_size, TokenExchange::heap_bytes(shape, world_size, options));
      TokenExchange ex(world, shape, options);
      Stream stream;
      const RouterNormalization router = router_of(world_size == 1);
      const uint64_t seed = fresh_seed();
      SCOPED_TRACE(seed_note(seed));
      const Routing routing = make_test_routing(RoutingCase::kEmptySlots, world_size, T, k, shape.num_experts, seed);
      const Schedule schedule = build_schedule(routing, shape.num_experts, shape.tile_m);
      const Inputs in = make_inputs(shape, ex.sizes().row_capacity, schedule, seed);
      upload_step(ex, routing, in);
      poison_outputs(ex);
      for (int l = 0; l < world.local_ranks(); ++l) {  // each routed slot's dx row, home
        const size_t home = static_cast<size_t>(world.first_local_rank() + l);
        Bf16Rows slots(static_cast<size_t>(T * k * D), kBf16Nan);
        for (int64_t route = 0; route < T * k; ++route) {
          const int32_t expert = routing.at(static_cast<int64_t>(home), route / k, route % k);
          if (expert < 0 || expert >= shape.num_experts) continue;
          const RouteLocation loc = schedule.routes[home][static_cast<size_t>(route)];
          const uint16_t* row = in.expert_dx[static_cast<size_t>(loc.dst_rank)].data() + loc.row * D;
          std::copy(row, row + D, slots.begin() + route * D);
        }
        upload(world, ex.backward_buffers().dx_slots, l, slots);
      }
      settle();
      ex.build_schedule(router, stream.get());
      ex.reverse_dispatch_filled_dx_slots(router, stream.get());
      stream.sync();
      ASSERT_NO_THROW(ex.check());
      const Twin twin{shape, routing, schedule, in, static_cast<float>(router.scale), router.normalize, shared, 0, false};
      for (int l = 0; l < world.local_ranks(); ++l) {
        const size_t rank = static_cast<size_t>(world.first_local_rank() + l);
        expect_same_bits(download<uint16_t>(world, ex.backward_buffers().dx, l, T * D),
                         twin.reduced(static_cast<int64_t>(rank), in.expert_dx, in.shared_dx[rank]),
                         "dx, rank " + std::to_string(rank));
        expect_same_bits(download<float>(world, ex.router_buffers().d_topk_scores, l, T * k),
                         twin.score_gradients_of(static_cast<int64_t>(rank)),
                         "d_topk_scores, rank " + std::to_string(rank));
      }
    }
  }
}

// ---- CUDA graph --------------------------------------------------------------------------------------

class GpuTransfersGraph : public testing::TestWithParam<int> {};

TEST_P(GpuTransfersGraph, ReplaysExactlyWithNewRoutingAndInputs) {
  CARACAL_REQUIRE_GPU();
  const int W = GetParam();
  const ExchangeShape shape = kShapes[0];
  const ExchangeOptions options{true, true, true};
  const RouterNormalization router{true, 2.5};
  comm::LoopbackWorld world(W, TokenExchange::heap_bytes(shape, W, options));
  TokenExchange ex(world, shape, options);
  Stream stream;

  const test::CapturedGraph graph(stream, [&](cudaStream_t s) { enqueue_step(ex, router, s); });

  const RoutingCase replays[] = {RoutingCase::kUniform, RoutingCase::kAllToOne, RoutingCase::kZipf,
                                 RoutingCase::kEmptySlots, RoutingCase::kDuplicates};
  for (RoutingCase routing_case : replays) {
    const uint64_t seed = fresh_seed();
    SCOPED_TRACE(std::string(name_of(routing_case)) + ", " + seed_note(seed));
    const Routing routing = make_test_routing(routing_case, W, shape.tokens, shape.top_k, shape.num_experts, seed);
    run_and_check(ex, routing, router, seed, [&] {
      graph.launch(stream);
      stream.sync();
    });
  }
}

std::string world_name(const testing::TestParamInfo<int>& info) { return "W" + std::to_string(info.param); }

INSTANTIATE_TEST_SUITE_P(Loopback, GpuTransfersGraph, testing::Values(1, 2, 4, 8), world_name);

// ---- API misuse ---------------------------------------------------------------------------------------

TEST(GpuTransfersApi, RefusesPassesWithoutTheirBuffers) {
  CARACAL_REQUIRE_GPU();
  const ExchangeShape shape = kShapes[0];
  const ExchangeOptions forward_only{true, false, false};
  comm::LoopbackWorld world(2, TokenExchange::heap_bytes(shape, 2, forward_only));
  TokenExchange ex(world, shape, forward_only);
  EXPECT_THROW(ex.reverse_combine(nullptr), Error);
  EXPECT_THROW(ex.reverse_dispatch(RouterNormalization{}, nullptr), Error);
}

TEST(GpuTransfersApi, RefusesBadYDestinations) {
  CARACAL_REQUIRE_GPU();
  const ExchangeShape shape = kShapes[0];
  const ExchangeOptions options{true, false, false};
  comm::LoopbackWorld world(2, TokenExchange::heap_bytes(shape, 2, options));
  TokenExchange ex(world, shape, options);
  __nv_bfloat16* y = world.local_pointer(ex.forward_buffers().y, 0);
  test::expect_error([&] { ex.combine(RouterNormalization{}, nullptr, 0, {y}); },
                     {"TokenExchange::combine", "one destination per local rank (2)", "got 1"});
  test::expect_error([&] { ex.combine(RouterNormalization{}, nullptr, 0, {y, nullptr}); },
                     {"TokenExchange::combine", "y[1] must not be null"});
}

TEST(GpuTransfersApi, RefusesASmallHeap) {
  CARACAL_REQUIRE_GPU();
  const ExchangeShape shape = kShapes[0];
  comm::LoopbackWorld world(2, TokenExchange::heap_bytes(shape, 2) / 2);
  try {
    TokenExchange ex(world, shape);
    ADD_FAILURE() << "expected caracal::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bytes of symmetric heap per rank (TokenExchange::heap_bytes)"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace caracal::exchange_test
