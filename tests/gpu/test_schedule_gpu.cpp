// The schedule table built on the GPU (TokenExchange::build_schedule) against its host twin
// (build_schedule in schedule.hpp): rows, segment offsets, counts, source counts, the inverse
// view and each rank's route rows, bit for bit, in loopback at W = 1, 2, 4, 8 and through a single-rank NCCL world; device
// detection of out-of-range expert ids; and the host-side validation of the exchange's shape.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "caracal/comm/loopback_world.hpp"
#include "caracal/comm/nccl_bootstrap.hpp"
#include "caracal/comm/nccl_world.hpp"
#include "caracal/error.hpp"
#include "caracal/routing.hpp"
#include "caracal/schedule.hpp"
#include "caracal/schedule_view.hpp"
#include "caracal/transfer/token_exchange.hpp"
#include "error_checks.hpp"
#include "exchange_test_support.hpp"
#include "gpu_test_util.hpp"

namespace caracal::exchange_test {
namespace {

using transfer::ExchangeOptions;
using transfer::ExchangeShape;
using transfer::TokenExchange;

static_assert(sizeof(ScheduleRow) == sizeof(int2) && sizeof(RouteLocation) == sizeof(int2),
              "host rows and locations mirror the device's int2 entries");

// Only the schedule's buffers (and the small router ones): no token rows.
constexpr ExchangeOptions kScheduleOnly{false, false, false};

std::vector<int64_t> widen(const std::vector<int32_t>& v) { return std::vector<int64_t>(v.begin(), v.end()); }

// Poisons every schedule output of every local rank (rows to capacity).
void poison_schedule(const TokenExchange& exchange) {
  const comm::World& world = exchange.world();
  const transfer::ScheduleBuffers& b = exchange.schedule_buffers();
  const int64_t L = exchange.sizes().local_experts;
  for (int l = 0; l < world.local_ranks(); ++l) {
    poison(world, b.rows, l, exchange.sizes().row_capacity, kPoisonByte);
    poison(world, b.expert_offset, l, L + 1, kPoisonByte);
    poison(world, b.expert_count, l, L, kPoisonByte);
    poison(world, b.source_count, l, L * world.world_size(), kPoisonByte);
    poison(world, b.route_location, l, exchange.sizes().routes, kPoisonByte);
    poison(world, b.route_rows, l, world.world_size() * exchange.sizes().routes, kPoisonByte);
  }
}

// route_rows of receiving rank `rank` as the host twin places them: per source and route, the
// route's row on `rank`, or -1.
std::vector<int32_t> expected_route_rows(const Schedule& want, int rank) {
  std::vector<int32_t> rows;
  for (const std::vector<RouteLocation>& source : want.routes) {
    for (const RouteLocation& route : source) rows.push_back(route.dst_rank == rank ? route.row : -1);
  }
  return rows;
}

void upload_routing(const TokenExchange& exchange, const Routing& routing) {
  const comm::World& world = exchange.world();
  const int64_t routes = routing.tokens_per_rank * routing.top_k;
  for (int l = 0; l < world.local_ranks(); ++l) {
    const int32_t* ids = routing.rank_topk(world.first_local_rank() + l);
    upload(world, exchange.schedule_buffers().topk_idx, l, std::vector<int32_t>(ids, ids + routes));
  }
}

// The device schedule of every local rank equals the host twin's, and rows past the total were
// left untouched.
void expect_schedule(const TokenExchange& exchange, const Schedule& want) {
  const comm::World& world = exchange.world();
  const transfer::ScheduleBuffers& b = exchange.schedule_buffers();
  const int64_t L = exchange.sizes().local_experts;
  for (int l = 0; l < world.local_ranks(); ++l) {
    const int rank = world.first_local_rank() + l;
    SCOPED_TRACE("rank " + std::to_string(rank));
    const RankSchedule& rs = want.ranks[static_cast<size_t>(rank)];
    const int64_t total = download<int32_t>(world, b.expert_offset, l, L + 1)[static_cast<size_t>(L)];
    ASSERT_EQ(total, rs.padded_rows());
    const std::vector<ScheduleRow> rows = download<ScheduleRow>(world, b.rows, l, exchange.sizes().row_capacity);
    EXPECT_TRUE(std::equal(rs.rows.begin(), rs.rows.end(), rows.begin())) << "rows differ";
    for (size_t r = static_cast<size_t>(total); r < rows.size(); ++r) {
      ASSERT_EQ(bits_of(rows[r]), 0xA5A5A5A5A5A5A5A5ull) << "row " << r << " past the total was written";
    }
    EXPECT_EQ(widen(download<int32_t>(world, b.expert_offset, l, L + 1)), rs.expert_offset);
    // The view the kernels read is this rank's table, sized to the most rows it can hold.
    const ScheduleView view = exchange.schedule_view(l);
    EXPECT_EQ(view.expert_offset, world.local_pointer(b.expert_offset, l));
    EXPECT_EQ(view.expert_count, world.local_pointer(b.expert_count, l));
    EXPECT_EQ(view.rows, world.local_pointer(b.rows, l));
    EXPECT_EQ(view.num_experts, L);
    EXPECT_EQ(view.ring_rows, 0);
    EXPECT_EQ(view.row_capacity % exchange.shape().tile_m, 0);
    EXPECT_LE(view.row_capacity, exchange.sizes().row_capacity);
    EXPECT_GE(view.row_capacity, rs.padded_rows());
    EXPECT_EQ(widen(download<int32_t>(world, b.expert_count, l, L)), rs.expert_count);
    EXPECT_EQ(widen(download<int32_t>(world, b.source_count, l, L * world.world_size())), rs.source_count);
    EXPECT_EQ(download<RouteLocation>(world, b.route_location, l, exchange.sizes().routes),
              want.routes[static_cast<size_t>(rank)])
        << "route locations (inverse view) differ";
    EXPECT_EQ(download<int32_t>(world, b.route_rows, l, world.world_size() * exchange.sizes().routes),
              expected_route_rows(want, rank))
        << "route rows (each route's row on this rank) differ";
  }
}

// Builds the schedule of the uploaded routing over poisoned outputs and waits for it.
void build_over_poison(TokenExchange& exchange) {
  const Stream stream;
  poison_schedule(exchange);
  settle();
  exchange.build_schedule(RouterNormalization{}, stream.get());  // g of whatever scores: not checked here
  stream.sync();
}

// Builds the schedule twice on poisoned outputs: both times equal to the host twin.
void expect_builds_match(TokenExchange& exchange, const Routing& routing, int64_t tile_m) {
  const Schedule want = build_schedule(routing, exchange.shape().num_experts, tile_m);
  upload_routing(exchange, routing);
  for (int run = 0; run < 2; ++run) {
    SCOPED_TRACE("run " + std::to_string(run));
    build_over_poison(exchange);
    ASSERT_NO_THROW(exchange.check());
    expect_schedule(exchange, want);
  }
}

// A schedule-only exchange of `shape` over a loopback world of `world_size` ranks.
struct LoopbackScheduleExchange {
  LoopbackScheduleExchange(const ExchangeShape& exchange_shape, int world_size)
      : shape(exchange_shape),
        world(world_size, TokenExchange::heap_bytes(shape, world_size, kScheduleOnly)),
        exchange(world, shape, kScheduleOnly) {}

  // A test routing of the world's ranks for this shape.
  Routing routing(RoutingCase c, uint64_t seed) const {
    return make_test_routing(c, world.world_size(), shape.tokens, shape.top_k, shape.num_experts, seed);
  }

  const ExchangeShape shape;
  comm::LoopbackWorld world;
  TokenExchange exchange;
};

// ---- Loopback sweep ---------------------------------------------------------------------------

struct ScheduleCase {
  int world;
  RoutingCase routing;
  int64_t tile_m;
  int64_t tokens, top_k, experts;
};

std::string name_of(const ScheduleCase& c) {
  return "W" + std::to_string(c.world) + "_" + name_of(c.routing) + "_tile" + std::to_string(c.tile_m) + "_T" +
         std::to_string(c.tokens) + "_k" + std::to_string(c.top_k) + "_E" + std::to_string(c.experts);
}

std::string case_name(const testing::TestParamInfo<ScheduleCase>& info) { return name_of(info.param); }

void PrintTo(const ScheduleCase& c, std::ostream* os) { *os << name_of(c); }

std::vector<ScheduleCase> schedule_cases() {
  std::vector<ScheduleCase> cases;
  for (const auto& [world, routing] : loopback_sweep()) {
    for (int64_t tile_m : {int64_t{128}, int64_t{7}}) {
      // T*k = 1800: two chunks, the second partial. Then many local experts (several 32-expert
      // batches of the offset scan) and six chunks.
      cases.push_back({world, routing, tile_m, 300, 6, 32});
      cases.push_back({world, routing, tile_m, 700, 8, 256});
    }
  }
  // Fine-grained experts at a real step's size (Qwen3-30B-A3B on one GPU: 65,536 routes, 64 blocks
  // of 16 chunks) and a world whose ranks each take several blocks of every source per CTA.
  for (RoutingCase routing : {RoutingCase::kUniform, RoutingCase::kZipf, RoutingCase::kAllToOne}) {
    cases.push_back({1, routing, 128, 8192, 8, 128});
    cases.push_back({4, routing, 128, 2048, 8, 128});
  }
  return cases;
}

class GpuSchedule : public testing::TestWithParam<ScheduleCase> {};

TEST_P(GpuSchedule, MatchesHostTwin) {
  CARACAL_REQUIRE_GPU();
  const ScheduleCase& c = GetParam();
  const TracedSeed seed;
  LoopbackScheduleExchange ex({c.tokens, c.top_k, 8, c.experts, c.tile_m}, c.world);
  expect_builds_match(ex.exchange, ex.routing(c.routing, seed.value()), c.tile_m);
}

INSTANTIATE_TEST_SUITE_P(Loopback, GpuSchedule, testing::ValuesIn(schedule_cases()), case_name);

// ---- NCCL, one rank ---------------------------------------------------------------------------

TEST(GpuScheduleNccl, SingleRankMatchesHostTwin) {
  CARACAL_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed_note(seed));
  const ExchangeShape shape{500, 8, 8, 64, 128};
  std::vector<comm::NcclComm> comms = comm::init_all({0});
  comm::NcclWorld world(comms[0].get(), TokenExchange::heap_bytes(shape, 1, kScheduleOnly));
  TokenExchange exchange(world, shape, kScheduleOnly);
  for (RoutingCase routing : {RoutingCase::kUniform, RoutingCase::kZipf, RoutingCase::kAllToOne}) {
    SCOPED_TRACE(name_of(routing));
    expect_builds_match(exchange, make_test_routing(routing, 1, shape.tokens, shape.top_k, shape.num_experts, seed),
                        shape.tile_m);
  }
}

// ---- Out-of-range expert ids --------------------------------------------------------------------

// The routing with every id outside [-1, E) turned into an empty slot: what the device schedules.
Routing sanitized(Routing routing, int64_t experts) {
  for (int32_t& id : routing.topk_idx) {
    if (id < -1 || id >= experts) id = -1;
  }
  return routing;
}

// Exchanges of different shapes in one process (a model's layers): one set up after another must
// not break the first's launches (the schedule kernel's shared-memory limit is the kernel's, not
// the exchange's).
TEST(GpuSchedule, ExchangesOfDifferentShapesAllBuild) {
  CARACAL_REQUIRE_GPU();
  const TracedSeed seed;
  LoopbackScheduleExchange large({64, 2, 8, 64, 128}, 1);  // 64 local experts: more shared memory
  LoopbackScheduleExchange small({64, 2, 8, 8, 128}, 2);
  ASSERT_GT(large.exchange.sizes().schedule_shared_bytes, small.exchange.sizes().schedule_shared_bytes);
  for (LoopbackScheduleExchange* ex : {&large, &small, &large}) {
    expect_builds_match(ex->exchange, ex->routing(RoutingCase::kUniform, seed.value()), ex->shape.tile_m);
  }
}

TEST(GpuScheduleFaults, OutOfRangeExpertIsRaisedAtCheck) {
  CARACAL_REQUIRE_GPU();
  const TracedSeed seed;
  LoopbackScheduleExchange ex({100, 4, 8, 16, 128}, 2);
  TokenExchange& exchange = ex.exchange;
  Routing routing = ex.routing(RoutingCase::kUniform, seed.value());
  const ExchangeShape& shape = ex.shape;
  routing.topk_idx[static_cast<size_t>((1 * shape.tokens + 3) * shape.top_k + 2)] = 16;  // rank 1, token 3, slot 2
  upload_routing(exchange, routing);
  build_over_poison(exchange);
  try {
    exchange.check();
    ADD_FAILURE() << "expected caracal::Error for expert id 16 with num_experts = 16";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("topk_idx of rank 1 holds expert id 16 at [token 3][slot 2]"),
              std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(exchange.check()) << "the fault is raised once";
  // The slot was scheduled as empty, and the exchange keeps working.
  expect_schedule(exchange, build_schedule(sanitized(routing, 16), 16, shape.tile_m));
  expect_builds_match(exchange, sanitized(routing, 16), shape.tile_m);
}

TEST(GpuScheduleFaults, ManyOutOfRangeIdsAreSafe) {
  CARACAL_REQUIRE_GPU();
  const TracedSeed seed;
  LoopbackScheduleExchange ex({300, 8, 8, 32, 16}, 4);
  Routing routing = ex.routing(RoutingCase::kUniform, seed.value());
  const int32_t garbage[] = {
      std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max(), -2, 32, 33, 1 << 20};
  std::mt19937_64 rng(seed.value());
  for (int32_t& id : routing.topk_idx) {
    if (rng() % 10 == 0) id = garbage[rng() % std::size(garbage)];
  }
  upload_routing(ex.exchange, routing);
  build_over_poison(ex.exchange);
  EXPECT_THROW(ex.exchange.check(), Error);
  expect_schedule(ex.exchange, build_schedule(sanitized(routing, 32), 32, ex.shape.tile_m));
}

// ---- Host-side validation (no GPU) ----------------------------------------------------------------

void expect_error(const ExchangeShape& shape, int64_t world, const std::string& mention) {
  try {
    (void)transfer::exchange_sizes(shape, world);
    ADD_FAILURE() << "expected caracal::Error mentioning '" << mention << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(mention), std::string::npos) << e.what();
  }
}

TEST(ScheduleViewRows, BufferRowIsTheScheduleRowWithoutARing) {
  const ScheduleView view{nullptr, nullptr, 4, 1024, 0, nullptr};
  for (int r : {0, 1, 127, 128, 1023}) EXPECT_EQ(view.buffer_row(r), r);
}

TEST(ScheduleViewRows, RingWrapsScheduleRowsOntoItsRows) {
  const ScheduleView view{nullptr, nullptr, 4, 1024, 256, nullptr};
  EXPECT_EQ(view.buffer_row(0), 0);
  EXPECT_EQ(view.buffer_row(255), 255);
  EXPECT_EQ(view.buffer_row(256), 0);
  EXPECT_EQ(view.buffer_row(300), 44);
  EXPECT_EQ(view.buffer_row(1023), 255);
}

TEST(ExchangeShapeValidation, SizesOfDeepSeekV3) {
  const transfer::ExchangeSizes s = transfer::exchange_sizes({4096, 8, 7168, 256, 128}, 8);
  EXPECT_EQ(s.routes, 32768);
  EXPECT_EQ(s.local_experts, 32);
  EXPECT_EQ(s.row_capacity, 8 * 32768 + 32 * 127);
  EXPECT_EQ(s.chunks, 512);  // 64-route chunks
  EXPECT_EQ(s.blocks, 32);   // of 16 chunks
  EXPECT_EQ(s.schedule_shared_bytes, (256 + (2 + 16) * 32 + 1) * sizeof(int32_t));  // 16 warps per CTA
}

TEST(ExchangeShapeValidation, NamesTheBadArgument) {
  const ExchangeShape good{64, 4, 64, 16, 128};
  ExchangeShape s = good;
  expect_error(s, 0, "world_size must be at least 1, got 0");
  s.tokens = 0;
  expect_error(s, 2, "tokens must be at least 1, got 0");
  s = good;
  s.top_k = -1;
  expect_error(s, 2, "top_k must be at least 1, got -1");
  s = good;
  s.hidden = 100;
  expect_error(s, 2, "hidden must be a positive multiple of 8 (rows move as 16-byte vectors of 8 bf16), got 100");
  s.hidden = 0;
  expect_error(s, 2, "hidden must be a positive multiple of 8");
  s = good;
  s.num_experts = 10;
  expect_error(s, 4, "num_experts (10) must be divisible by the world size (4)");
  s = good;
  s.tile_m = 0;
  expect_error(s, 2, "tile_m must be in [1, 2^31), got 0");
  s = good;
  s.tokens = int64_t{1} << 28;
  expect_error(s, 2, "world_size * tokens * top_k = 2 * 268435456 * 4 must be below 2^31");
  s = ExchangeShape{1, 1, 8, 1024, int64_t{1} << 22};
  expect_error(s, 1, "the row capacity world_size * tokens * top_k + (num_experts / world_size) * (tile_m - 1)");
  s = ExchangeShape{64, 4, 64, 60000, 128};
  expect_error(s, 1, "bytes of shared memory per schedule CTA");
}

TEST(ExchangeShapeValidation, HeapBytesFollowTheOptions) {
  const ExchangeShape shape{64, 4, 64, 16, 128};
  const size_t schedule_only = TokenExchange::heap_bytes(shape, 2, kScheduleOnly);
  const size_t forward = TokenExchange::heap_bytes(shape, 2, {true, false, false});
  const size_t both = TokenExchange::heap_bytes(shape, 2, {true, true, false});
  const size_t with_shared = TokenExchange::heap_bytes(shape, 2, {true, true, true});
  EXPECT_LT(schedule_only, forward);
  EXPECT_LT(forward, both);
  EXPECT_EQ(with_shared - both, 2 * static_cast<size_t>(64 * 64 * 2));  // shared_out + shared_dx, 256-aligned
  // Without expert_out (the fused forward stores rows home) and expert_dx (the dx GEMM does): one
  // row of D per schedule row less each, R = W*T*k + L*(tile_m - 1) = 2*64*4 + 8*127 rows.
  ExchangeOptions fused = {true, true, false};
  fused.expert_out = false;
  const size_t rows = 2 * 64 * 4 + 8 * 127;
  EXPECT_EQ(both - TokenExchange::heap_bytes(shape, 2, fused), (rows * 64 * 2 + 255) / 256 * 256);
  fused.expert_dx = false;
  EXPECT_EQ(both - TokenExchange::heap_bytes(shape, 2, fused), 2 * ((rows * 64 * 2 + 255) / 256 * 256));
  // A ring (the fused layer's): expert_x and expert_dy hold 256 rows instead of R.
  ExchangeOptions ring = fused;
  ring.ring_rows = 256;
  EXPECT_EQ(TokenExchange::heap_bytes(shape, 2, fused) - TokenExchange::heap_bytes(shape, 2, ring),
            2 * ((rows * 64 * 2 + 255) / 256 * 256 - 256 * 64 * 2));
  ring.ring_rows = 200;
  test::expect_error([&] { (void)TokenExchange::heap_bytes(shape, 2, ring); },
                     {"options.ring_rows must be 0 or a multiple of tile_m (128)", "1408 rows", "got 200"});
  ring.ring_rows = 1536;
  test::expect_error([&] { (void)TokenExchange::heap_bytes(shape, 2, ring); }, {"up to the schedule's 1408 rows"});
  ring.ring_rows = 256;
  // expert_dx over a ring: a ring of dx rows (the fused backward's groups), 256 rows of D.
  ExchangeOptions dx_ring = ring;
  dx_ring.expert_dx = true;
  EXPECT_EQ(TokenExchange::heap_bytes(shape, 2, dx_ring) - TokenExchange::heap_bytes(shape, 2, ring),
            static_cast<size_t>(256 * 64 * 2));
  ring.expert_out = true;
  test::expect_error([&] { (void)TokenExchange::heap_bytes(shape, 2, ring); },
                     {"options.ring_rows > 0 needs expert_out = false"});
  EXPECT_THROW((void)TokenExchange::heap_bytes({64, 4, 60, 16, 128}, 2), Error);
}

}  // namespace
}  // namespace caracal::exchange_test
