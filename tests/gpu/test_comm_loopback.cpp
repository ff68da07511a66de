// The world barrier and symmetric heap on the loopback backend: W virtual ranks on one GPU.
#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "caracal/comm/cuda_memory.hpp"
#include "caracal/comm/loopback_world.hpp"
#include "caracal/error.hpp"
#include "comm_test_support.hpp"
#include "error_checks.hpp"
#include "gpu_test_util.hpp"

namespace caracal::test {
namespace {

using comm::LoopbackWorld;

constexpr size_t kHeapBytes = size_t(1) << 20;
constexpr size_t kWords = 16 * 1024;  // 64 KiB per rank

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// The message World::check() throws, or "" when it does not throw.
std::string check_message(comm::World& world) {
  try {
    world.check();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

class LoopbackExchange : public ::testing::TestWithParam<int> {};

TEST_P(LoopbackExchange, ManyIterationsInOneLaunchAndAcrossLaunches) {
  CARACAL_REQUIRE_GPU();
  LoopbackWorld world(GetParam(), kHeapBytes);
  Exchange exchange(world, kWords);
  Stream stream;
  constexpr int kLaunches = 3;
  for (int i = 0; i < kLaunches; ++i) launch_exchange(world, exchange.buffers(), 4, 50, stream.get());
  stream.sync();
  EXPECT_NO_THROW(world.check());
  exchange.expect_clean(kLaunches);
}

TEST_P(LoopbackExchange, GraphReplaysReuseTheBarrierEpochs) {
  CARACAL_REQUIRE_GPU();
  LoopbackWorld world(GetParam(), kHeapBytes);
  Exchange exchange(world, kWords);
  Stream stream;
  launch_exchange(world, exchange.buffers(), 2, 5, stream.get());  // before capture: epochs already advanced
  stream.sync();
  constexpr int kReplays = 5;
  replay_graph(stream, kReplays, [&](cudaStream_t s) { launch_exchange(world, exchange.buffers(), 2, 5, s); });
  EXPECT_NO_THROW(world.check());
  exchange.expect_clean(1 + kReplays);
}

// Many CTAs per rank on one counter: one CTA per SM across the world (below the occupancy limit,
// so that it also fits under compute-sanitizer's instrumentation).
TEST_P(LoopbackExchange, OneCtaPerSm) {
  CARACAL_REQUIRE_GPU();
  LoopbackWorld world(GetParam(), kHeapBytes);
  Exchange exchange(world, kWords);
  Stream stream;
  const int ctas = world.multiprocessors() / world.local_ranks();
  ASSERT_GE(ctas, 1);
  expect_clean_launch(world, exchange, ctas, 10, stream, 1);
}

INSTANTIATE_TEST_SUITE_P(Worlds, LoopbackExchange, ::testing::Values(1, 2, 4, 8),
                         [](const ::testing::TestParamInfo<int>& param) { return "W" + std::to_string(param.param); });

// A rank that never arrives: the first leader to time out aborts the world, so every wait of every
// rank ends after one timeout (not one per barrier); the world then stays faulted, and every later
// launch stops at its first barrier, until reset() brings it back.
TEST(LoopbackWorld, RankThatNeverArrivesAbortsTheWorldUntilReset) {
  CARACAL_REQUIRE_GPU();
  constexpr int kAbsent = 2;
  LoopbackWorld world(4, kHeapBytes);
  Exchange exchange(world, kWords);
  Stream stream;

  for (int attempt = 0; attempt < 2; ++attempt) {  // the second failure is reported too
    world.set_wait_timeout(std::chrono::milliseconds(50), stream.get());
    auto start = std::chrono::steady_clock::now();
    launch_barrier_without_rank(world, kAbsent, 2, stream.get());
    stream.sync();  // returns: the waits are bounded
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
    const std::string message = check_message(world);
    EXPECT_TRUE(contains(message, "world barrier")) << message;
    EXPECT_TRUE(contains(message, "waited for rank 2")) << message;
    EXPECT_TRUE(contains(message, "'barrier_without_rank'")) << message;
    EXPECT_TRUE(contains(message, "50 ms")) << message;
    EXPECT_TRUE(contains(message, "World::reset()")) << message;
    EXPECT_EQ(check_message(world), message) << "the world stays faulted until reset()";
    EXPECT_TRUE(world.faulted());

    // Aborted: a launch stops at its first barrier at once, even with the default timeout.
    world.set_wait_timeout(comm::World::kDefaultWaitTimeout, stream.get());
    start = std::chrono::steady_clock::now();
    launch_exchange(world, exchange.buffers(), 2, 3, stream.get());
    stream.sync();
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
    exchange.expect_clean(static_cast<uint32_t>(attempt));  // that launch did nothing

    world.reset(stream.get());
    EXPECT_FALSE(world.faulted());
    expect_clean_launch(world, exchange, 2, 3, stream, static_cast<uint32_t>(attempt + 1));
  }
}

// A rank whose CTAs arrive late (a host stall, injected): the others give up after the timeout and
// abort the world; the stalled rank, arriving, finds it aborted. Every wait ends within about one
// timeout, and the error names the late rank.
TEST(LoopbackWorld, StalledRankAbortsTheWorldAfterOneTimeout) {
  CARACAL_REQUIRE_GPU();
  LoopbackWorld world(4, kHeapBytes);
  Exchange exchange(world, kWords);
  Stream stream;
  world.set_wait_timeout(std::chrono::milliseconds(100), stream.get());
  world.stall_next_barrier(1, std::chrono::seconds(20), stream.get());
  const auto start = std::chrono::steady_clock::now();
  launch_exchange(world, exchange.buffers(), 2, 5, stream.get());
  stream.sync();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
  const std::string message = check_message(world);
  EXPECT_TRUE(contains(message, "waited for rank 1")) << message;
  EXPECT_TRUE(contains(message, "100 ms")) << message;
  world.reset(stream.get());
  expect_clean_launch(world, exchange, 2, 5, stream, 1);  // the stall was for one barrier only
}

// A graph captured before set_wait_timeout(), stall_next_barrier() and reset() follows all three
// when replayed: the stall arms in a replay, the shorter timeout expires there, check() raises;
// after reset() the same graph runs clean; a second stall in a later replay raises again.
TEST(LoopbackWorld, GraphCapturedEarlierFollowsTimeoutStallAndReset) {
  CARACAL_REQUIRE_GPU();
  LoopbackWorld world(4, kHeapBytes);
  Exchange exchange(world, kWords);
  Stream stream;
  const CapturedGraph graph(stream, [&](cudaStream_t s) { launch_exchange(world, exchange.buffers(), 2, 5, s); });
  uint32_t clean = 0;  // replays that completed
  graph.launch(stream);
  stream.sync();
  EXPECT_NO_THROW(world.check());
  exchange.expect_clean(++clean);

  for (int stall = 0; stall < 2; ++stall) {
    SCOPED_TRACE("stall " + std::to_string(stall));
    world.set_wait_timeout(std::chrono::milliseconds(100), stream.get());  // captured under 10 minutes
    world.stall_next_barrier(1, std::chrono::seconds(20), stream.get());
    const auto start = std::chrono::steady_clock::now();
    graph.launch(stream);
    stream.sync();
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
    const std::string message = check_message(world);
    EXPECT_TRUE(contains(message, "waited for rank 1")) << message;
    EXPECT_TRUE(contains(message, "100 ms")) << message;
    EXPECT_TRUE(contains(message, "'exchange'")) << message;
    graph.launch(stream);  // the world stays aborted: this replay stops at its first barrier
    stream.sync();
    EXPECT_EQ(check_message(world), message);
    exchange.expect_clean(clean);

    world.reset(stream.get());
    world.set_wait_timeout(comm::World::kDefaultWaitTimeout, stream.get());
    for (int replay = 0; replay < 2; ++replay) graph.launch(stream);
    stream.sync();
    EXPECT_NO_THROW(world.check());
    clean += 2;
    exchange.expect_clean(clean);
  }
}

// reset() waits for the failed launches before clearing the fault: a launch still timing out when
// reset() is called cannot post its error after it and swallow the error of the next launch.
TEST(LoopbackWorld, ResetDrainsTheFailedLaunchSoTheNextErrorIsReported) {
  CARACAL_REQUIRE_GPU();
  LoopbackWorld world(2, kHeapBytes);
  Stream stream;
  world.set_wait_timeout(std::chrono::milliseconds(100), stream.get());
  launch_barrier_without_rank(world, 1, 1, stream.get());
  world.reset(stream.get());  // called while that launch still waits
  EXPECT_NO_THROW(world.check()) << "reset() cleared the fault of the launch before it";
  launch_barrier_without_rank(world, 1, 1, stream.get());
  stream.sync();
  const std::string message = check_message(world);
  EXPECT_TRUE(contains(message, "waited for rank 1")) << "the failure after reset() was not reported: " << message;
}

// The fault flag reads 0.0 on a healthy world, 1.0 on every local rank once a wait has expired,
// and 0.0 again after reset(), all in stream order on the device.
TEST(LoopbackWorld, FaultFlagFollowsTheAbortAndReset) {
  CARACAL_REQUIRE_GPU();
  LoopbackWorld world(4, kHeapBytes);
  Exchange exchange(world, kWords);
  Stream stream;
  const auto flags = [&] {
    stream.sync();
    std::vector<float> values;
    for (int l = 0; l < world.local_ranks(); ++l) {
      float v = -1.0f;
      check_cuda(cudaMemcpy(&v, world.fault_flag(l), sizeof(v), cudaMemcpyDeviceToHost), "cudaMemcpy(fault flag)");
      values.push_back(v);
    }
    return values;
  };
  launch_exchange(world, exchange.buffers(), 2, 3, stream.get());
  EXPECT_EQ(flags(), std::vector<float>(4, 0.0f));
  world.set_wait_timeout(std::chrono::milliseconds(50), stream.get());
  world.stall_next_barrier(3, std::chrono::seconds(20), stream.get());
  launch_exchange(world, exchange.buffers(), 2, 3, stream.get());
  EXPECT_EQ(flags(), std::vector<float>(4, 1.0f));
  EXPECT_TRUE(world.faulted());
  world.reset(stream.get());
  world.set_wait_timeout(comm::World::kDefaultWaitTimeout, stream.get());
  EXPECT_EQ(flags(), std::vector<float>(4, 0.0f));
  expect_clean_launch(world, exchange, 2, 3, stream, 2);
  EXPECT_EQ(flags(), std::vector<float>(4, 0.0f));
}

TEST(LoopbackWorld, ResetRefusesToBeCaptured) {
  CARACAL_REQUIRE_GPU();
  LoopbackWorld world(2, kHeapBytes);
  Stream stream;
  std::string message;
  try {
    const CapturedGraph graph(stream, [&](cudaStream_t s) { world.reset(s); });
  } catch (const Error& e) {
    message = e.what();
  }
  EXPECT_TRUE(contains(message, "reset() cannot be captured")) << message;
}

TEST(LoopbackWorld, StallBelowTheTimeoutIsNotAnError) {
  CARACAL_REQUIRE_GPU();
  LoopbackWorld world(2, kHeapBytes);
  Exchange exchange(world, kWords);
  Stream stream;
  world.set_wait_timeout(std::chrono::seconds(5), stream.get());
  world.stall_next_barrier(0, std::chrono::milliseconds(300), stream.get());
  expect_clean_launch(world, exchange, 2, 2, stream, 1);
}

// ---- Readiness flags (ready_flags.cuh) -----------------------------------------------------

// Producer CTAs publish blocks and raise their counters; consumer CTAs wait for each block and
// check every word. Three launches on the same counters (they only grow: each launch's targets
// start where the last one ended), then a graph replay.
TEST(ReadyFlags, ConsumersSeeWhatProducersPublished) {
  CARACAL_REQUIRE_GPU();
  LoopbackWorld world(1, kHeapBytes);
  ReadyBuffers b;
  b.producers = 16;
  b.consumers = 16;
  b.rounds = 12;
  b.block_words = 2048;
  auto data = comm::device_alloc<uint32_t>(size_t(b.rounds) * b.producers * b.block_words, "cudaMalloc(data)");
  auto counters = comm::device_alloc<uint32_t>(size_t(b.producers), "cudaMalloc(counters)");
  auto mismatches = comm::device_alloc<unsigned long long>(1, "cudaMalloc(mismatches)");
  CARACAL_ASSERT_CUDA(cudaMemset(counters.get(), 0, sizeof(uint32_t) * b.producers));
  CARACAL_ASSERT_CUDA(cudaMemset(mismatches.get(), 0, sizeof(unsigned long long)));
  b.data = data.get();
  b.counters = counters.get();
  b.mismatches = mismatches.get();
  Stream stream;
  for (uint32_t launch = 0; launch < 3; ++launch) launch_ready_stress(world, b, launch, stream.get());
  replay_graph(stream, 1, [&](cudaStream_t s) { launch_ready_stress(world, b, 3, s); });
  EXPECT_NO_THROW(world.check());
  unsigned long long bad = 0;
  std::vector<uint32_t> count(static_cast<size_t>(b.producers));
  CARACAL_ASSERT_CUDA(cudaMemcpy(&bad, mismatches.get(), sizeof(bad), cudaMemcpyDeviceToHost));
  CARACAL_ASSERT_CUDA(cudaMemcpy(count.data(), counters.get(), sizeof(uint32_t) * count.size(), cudaMemcpyDeviceToHost));
  EXPECT_EQ(bad, 0u) << "consumers read words the producers had not published";
  for (uint32_t c : count) EXPECT_EQ(c, 4u * static_cast<uint32_t>(b.rounds));
}

TEST(ReadyFlags, AWaitNobodyServesTimesOutNamingTheCounter) {
  CARACAL_REQUIRE_GPU();
  LoopbackWorld world(1, kHeapBytes);
  auto counter = comm::device_alloc<uint32_t>(1, "cudaMalloc(counter)");
  CARACAL_ASSERT_CUDA(cudaMemset(counter.get(), 0, sizeof(uint32_t)));
  Stream stream;
  world.set_wait_timeout(std::chrono::milliseconds(50), stream.get());
  launch_ready_wait_for_nothing(world, counter.get(), 3, stream.get());
  stream.sync();
  const std::string message = check_message(world);
  EXPECT_TRUE(contains(message, "readiness counter")) << message;
  EXPECT_TRUE(contains(message, "waited on counter 3 for 50 ms")) << message;
  EXPECT_TRUE(contains(message, "'ready_wait_for_nothing'")) << message;
  world.reset(stream.get());
  EXPECT_NO_THROW(world.check());
}

TEST(LoopbackWorld, RefusesAGridThatCannotBeCoResident) {
  CARACAL_REQUIRE_GPU();
  LoopbackWorld world(8, kHeapBytes);
  Exchange exchange(world, kWords);
  Stream stream;
  const int too_many = exchange_max_ctas_per_rank(world) + 1;
  try {
    launch_exchange(world, exchange.buffers(), too_many, 1, stream.get());
    ADD_FAILURE() << "a grid of 8 x " << too_many << " CTAs was launched";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "cannot all be resident")) << e.what();
  }
  // Nothing ran and nothing is pending: the world still works.
  launch_exchange(world, exchange.buffers(), 1, 1, stream.get());
  stream.sync();
  exchange.expect_clean(1);
}

// A launch that starts early (LaunchShape::starts_early) begins while the launch before it still
// runs, and what it reads after wait_for_previous_grid() is what that launch wrote: directly and
// replayed from a CUDA graph (a programmatic edge). Were it launched cooperatively, CUDA would start
// it only after the writer's end: the overlap is checked, not assumed.
TEST(EarlyStart, TheLaterLaunchOverlapsTheEarlierAndSeesItsWrites) {
  CARACAL_REQUIRE_GPU();
  LoopbackWorld world(1, kHeapBytes);
  const int reader_ctas = early_reader_max_ctas_per_rank(world);
  auto value = comm::device_alloc<uint32_t>(1, "cudaMalloc(value)");
  auto seen = comm::device_alloc<uint32_t>(size_t(reader_ctas), "cudaMalloc(seen)");
  auto writer_end = comm::device_alloc<unsigned long long>(1, "cudaMalloc(writer_end)");
  auto reader_start = comm::device_alloc<unsigned long long>(1, "cudaMalloc(reader_start)");
  const EarlyStartBuffers b{value.get(), seen.get(), writer_end.get(), reader_start.get()};
  constexpr uint64_t kSpinNs = 200'000;
  Stream stream;
  const uint32_t first = static_cast<uint32_t>(fresh_seed()) | 1u;
  const CapturedGraph graph(stream,
                           [&](cudaStream_t s) { launch_early_start_pair(world, b, first + 1, kSpinNs, reader_ctas, s); });
  for (int run = 0; run < 2; ++run) {
    SCOPED_TRACE(run == 0 ? "launched" : "replayed from a graph");
    CARACAL_ASSERT_CUDA(cudaMemset(value.get(), 0, sizeof(uint32_t)));
    CARACAL_ASSERT_CUDA(cudaMemset(seen.get(), 0, sizeof(uint32_t) * size_t(reader_ctas)));
    CARACAL_ASSERT_CUDA(cudaMemset(writer_end.get(), 0, sizeof(unsigned long long)));
    CARACAL_ASSERT_CUDA(cudaMemset(reader_start.get(), 0xff, sizeof(unsigned long long)));
    const uint32_t expected = run == 0 ? first : first + 1;
    if (run == 0) {
      launch_early_start_pair(world, b, expected, kSpinNs, reader_ctas, stream.get());
    } else {
      graph.launch(stream);
    }
    stream.sync();
    EXPECT_NO_THROW(world.check());
    std::vector<uint32_t> got(static_cast<size_t>(reader_ctas));
    unsigned long long end = 0, start = 0;
    CARACAL_ASSERT_CUDA(cudaMemcpy(got.data(), seen.get(), sizeof(uint32_t) * got.size(), cudaMemcpyDeviceToHost));
    CARACAL_ASSERT_CUDA(cudaMemcpy(&end, writer_end.get(), sizeof(end), cudaMemcpyDeviceToHost));
    CARACAL_ASSERT_CUDA(cudaMemcpy(&start, reader_start.get(), sizeof(start), cudaMemcpyDeviceToHost));
    for (size_t cta = 0; cta < got.size(); ++cta) {
      ASSERT_EQ(got[cta], expected) << "reader CTA " << cta << " read before the writer's store";
    }
    EXPECT_LT(start, end) << "the reader started " << static_cast<double>(start - end) / 1000.0
                          << " us after the writer ended: no early start";
  }
}

TEST(EarlyStart, RefusesAGridThatCannotBeResident) {
  CARACAL_REQUIRE_GPU();
  LoopbackWorld world(1, kHeapBytes);
  auto value = comm::device_alloc<uint32_t>(1, "cudaMalloc(value)");
  auto counters = comm::device_alloc<unsigned long long>(2, "cudaMalloc(times)");
  const int too_many = early_reader_max_ctas_per_rank(world) + 1;
  auto seen = comm::device_alloc<uint32_t>(size_t(too_many), "cudaMalloc(seen)");
  const EarlyStartBuffers b{value.get(), seen.get(), counters.get(), counters.get() + 1};
  Stream stream;
  test::expect_error([&] { launch_early_start_pair(world, b, 7u, 0, too_many, stream.get()); },
                     {"early_reader", "cannot all be resident"});
  stream.sync();  // the writer ran; the world still works
  EXPECT_NO_THROW(world.check());
}

TEST(LoopbackWorld, HeapBookkeeping) {
  CARACAL_REQUIRE_GPU();
  LoopbackWorld world(2, 1000);  // rounded up to 1024
  EXPECT_EQ(world.heap_bytes_per_rank(), 1024u);
  const auto a = world.allocate<uint32_t>(10);
  const auto b = world.allocate<double>(3);
  EXPECT_EQ(b.offset - a.offset, 256u);
  EXPECT_EQ(world.heap_bytes_left(), 512u);
  EXPECT_EQ(reinterpret_cast<char*>(world.local_pointer(b, 1)), world.local_heap(1) + b.offset);
  try {
    (void)world.allocate<char>(600);
    ADD_FAILURE() << "allocation beyond the heap succeeded";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "symmetric heap: asked for 600 bytes, 512 of 1024 left");
  }
}

// The heaps come from the allocator given (one block, freed with the world) and the exchange runs on
// them; an allocator with one function only is refused.
TEST(LoopbackWorld, HeapsFromTheGivenAllocator) {
  CARACAL_REQUIRE_GPU();
  std::vector<std::pair<void*, size_t>> taken;
  std::vector<void*> freed;
  comm::DeviceAllocator allocator;
  allocator.allocate = [&](size_t bytes) {
    void* p = nullptr;
    check_cuda(cudaMalloc(&p, bytes), "cudaMalloc(test allocator)");
    taken.emplace_back(p, bytes);
    return p;
  };
  allocator.free = [&](void* p) {
    freed.push_back(p);
    (void)cudaFree(p);
  };
  {
    LoopbackWorld world(3, kHeapBytes, 0, allocator);
    ASSERT_EQ(taken.size(), 1u);
    const size_t stride = static_cast<size_t>(world.local_heap(1) - world.local_heap(0));  // heap + barrier state
    EXPECT_GE(stride, kHeapBytes);
    EXPECT_EQ(taken[0].second, 3 * stride);
    EXPECT_EQ(world.local_heap(0), static_cast<char*>(taken[0].first));
    EXPECT_EQ(world.local_heap(2), static_cast<char*>(taken[0].first) + 2 * stride);
    Exchange exchange(world, kWords);
    Stream stream;
    launch_exchange(world, exchange.buffers(), 4, 20, stream.get());
    stream.sync();
    EXPECT_NO_THROW(world.check());
    exchange.expect_clean(1);
    EXPECT_TRUE(freed.empty());
  }
  EXPECT_EQ(freed, std::vector<void*>{taken[0].first});
  comm::DeviceAllocator half;
  half.allocate = allocator.allocate;
  try {
    LoopbackWorld world(2, kHeapBytes, 0, half);
    ADD_FAILURE() << "a world was built with an allocator of one function";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "LoopbackWorld heaps: the allocator needs both allocate and free")) << e.what();
  }
}

}  // namespace
}  // namespace caracal::test
