// Host-side pieces of the communication layer that need no GPU: the heap allocator, custom device
// allocators, argument checks, device-error messages, and the NCCL bootstrap's id and environment
// handling.
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include "caracal/comm/cuda_check.hpp"
#include "caracal/comm/cuda_memory.hpp"
#include "caracal/comm/device_error.hpp"
#include "caracal/comm/heap_allocator.hpp"
#include "caracal/comm/loopback_world.hpp"
#include "caracal/comm/nccl_bootstrap.hpp"
#include "caracal/comm/nccl_world.hpp"
#include "caracal/comm/world.hpp"
#include "caracal/error.hpp"

namespace caracal::comm {
namespace {

// The message of the caracal::Error that `f` throws ("" if it throws none).
template <typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Sets (or, with nullptr, unsets) an environment variable for one test, restoring it afterwards.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) {
      had_ = true;
      old_ = old;
    }
    if (value != nullptr) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (had_) {
      setenv(name_, old_.c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

TEST(SymmetricHeapAllocator, HandsOutAlignedOffsetsAfterTheReservedBase) {
  SymmetricHeapAllocator heap(512, 4096);
  EXPECT_EQ(heap.allocate(1), 512u);
  EXPECT_EQ(heap.allocate(256), 768u);
  EXPECT_EQ(heap.allocate(257), 1024u);
  EXPECT_EQ(heap.allocate(0), 1536u);  // an empty buffer takes no space
  EXPECT_EQ(heap.allocate(3, 100), 1536u);
  EXPECT_EQ(heap.used(), 1536u);
  EXPECT_EQ(heap.left(), 2560u);
  EXPECT_EQ(heap.capacity(), 4096u);
}

TEST(SymmetricHeapAllocator, FillsExactlyAndSaysWhatIsLeft) {
  SymmetricHeapAllocator heap(0, 1024);
  EXPECT_EQ(heap.allocate(768), 0u);
  EXPECT_EQ(error_of([&] { heap.allocate(257); }), "symmetric heap: asked for 257 bytes, 256 of 1024 left");
  EXPECT_EQ(heap.allocate(256), 768u);
  EXPECT_EQ(heap.left(), 0u);
  EXPECT_EQ(error_of([&] { heap.allocate(1); }), "symmetric heap: asked for 1 bytes, 0 of 1024 left");
}

TEST(SymmetricHeapAllocator, RejectsOverflowAndMisalignedSetup) {
  SymmetricHeapAllocator heap(0, 1024);
  EXPECT_TRUE(contains(error_of([&] { heap.allocate(size_t(1) << 62, 8); }), "overflows size_t"));
  EXPECT_TRUE(contains(error_of([&] { heap.allocate(~size_t(0)); }), "asked for"));
  EXPECT_TRUE(contains(error_of([] { SymmetricHeapAllocator(100, 1024); }), "multiples of 256"));
  EXPECT_TRUE(contains(error_of([] { SymmetricHeapAllocator(0, 1000); }), "multiples of 256"));
}

TEST(LoopbackWorld, RejectsBadArgumentsBeforeTouchingTheGpu) {
  EXPECT_EQ(error_of([] { LoopbackWorld(0, 1024); }), "LoopbackWorld: world_size must be at least 1, got 0");
  EXPECT_EQ(error_of([] { LoopbackWorld(-3, 1024); }), "LoopbackWorld: world_size must be at least 1, got -3");
  EXPECT_TRUE(contains(error_of([] { LoopbackWorld(4096, 1024); }), "world_size must be at most 1024"));
  EXPECT_TRUE(contains(error_of([] { LoopbackWorld(2, 1024, -1); }), "device must be >= 0"));
  EXPECT_TRUE(contains(error_of([] { LoopbackWorld(2, size_t(1) << 50); }), "heap_bytes_per_rank"));
}

// NCCL reads NCCL_NVLS_ENABLE once per process: the helpers refuse to make a communicator unless
// the environment already holds "0", and never set it.
TEST(NcclBootstrap, RefusesUnlessTheEnvironmentTurnedMulticastOff) {
  for (const char* value : {static_cast<const char*>(nullptr), "1", "", "00"}) {
    const ScopedEnv env("NCCL_NVLS_ENABLE", value);
    const std::string message = error_of([] { require_nccl_environment(); });
    EXPECT_TRUE(contains(message, "set NCCL_NVLS_ENABLE=0 in the environment")) << message;
    EXPECT_TRUE(contains(message, value == nullptr ? "unset" : "\"" + std::string(value) + "\"")) << message;
    const char* after = std::getenv("NCCL_NVLS_ENABLE");
    EXPECT_EQ(after == nullptr, value == nullptr) << "the environment was changed";
    if (after != nullptr && value != nullptr) {
      EXPECT_STREQ(after, value);
    }
  }
  const ScopedEnv off("NCCL_NVLS_ENABLE", "0");
  EXPECT_EQ(error_of([] { require_nccl_environment(); }), "");
}

// A custom allocator's block is given back to it on every path: a refused (misaligned) block at
// once, an accepted one when its handle goes. The fake's blocks are host memory never touched.
TEST(AllocateDeviceBlock, GivesEveryBlockBackToItsAllocator) {
  alignas(256) static char memory[1024];
  char* next = memory;
  std::vector<void*> allocated, freed;
  DeviceAllocator allocator;
  allocator.allocate = [&](size_t) {
    allocated.push_back(next);
    return static_cast<void*>(next);
  };
  allocator.free = [&](void* block) { freed.push_back(block); };

  next = memory + 16;
  EXPECT_TRUE(contains(error_of([&] { allocate_device_block(64, allocator, "test block"); }),
                       "test block: the allocator must return 256-byte aligned memory"));
  EXPECT_EQ(freed, allocated);

  next = memory + 256;
  {
    const DeviceBlock block = allocate_device_block(64, allocator, "test block");
    EXPECT_EQ(block.get(), memory + 256);
    EXPECT_EQ(freed.size(), 1u);
  }
  EXPECT_EQ(freed, allocated);

  next = nullptr;  // a failed allocation: nothing to give back
  EXPECT_TRUE(contains(error_of([&] { allocate_device_block(64, allocator, "test block"); }), "returned null"));
  EXPECT_EQ(freed.size(), 2u);
}

TEST(NcclWorld, RejectsANullCommunicator) {
  EXPECT_EQ(error_of([] { NcclWorld(nullptr, 1024); }), "NcclWorld: comm must not be null");
}

TEST(DeviceError, NamesTheWaitTheRanksAndTheLaunch) {
  DeviceErrorRecord record{};
  record.tag = static_cast<uint32_t>(WaitId::barrier_peer);
  record.rank = 1;
  record.peer = 3;
  record.launch = 7;
  record.seen = 4;
  record.timeout_ns = 50'000'000;
  const std::string message = describe_device_error(record, "dispatch");
  EXPECT_TRUE(contains(message, "device wait timed out: world barrier (the rank's leader waiting for a peer rank"))
      << message;
  EXPECT_TRUE(contains(message, "rank 1 waited for rank 3 for 50 ms (flag value 4) in launch 7 'dispatch'")) << message;
  EXPECT_TRUE(contains(message, "World::reset()")) << message;
  EXPECT_TRUE(contains(message, "poisoned (NaN)")) << message;

  record.tag = static_cast<uint32_t>(WaitId::barrier_release);
  record.peer = -1;
  const std::string release = describe_device_error(record, "combine");
  EXPECT_TRUE(contains(release, "a CTA waiting for the rest of its own rank")) << release;
  EXPECT_TRUE(contains(release, "rank 1 waited for 50 ms")) << release;
  EXPECT_EQ(wait_description(static_cast<WaitId>(99)), "unknown wait 99");

  record.tag = static_cast<uint32_t>(WaitId::world_aborted);
  record.rank = 0;
  record.peer = 2;
  const std::string aborted = describe_device_error(record, "dispatch");
  record.tag = static_cast<uint32_t>(WaitId::ready_counter);
  record.peer = 5;
  const std::string ready = describe_device_error(record, "fused forward");
  EXPECT_TRUE(contains(ready, "readiness counter")) << ready;
  EXPECT_TRUE(contains(ready, "rank 0 waited on counter 5 for 50 ms")) << ready;
  EXPECT_TRUE(contains(aborted, "rank 0 found the world aborted by rank 2 in launch 7 'dispatch'")) << aborted;
}

TEST(World, FirstMismatchNamesTheFieldAndEveryRanksValue) {
  const std::vector<const char*> names{"hidden", "top_k"};
  EXPECT_EQ(detail::first_mismatch(names, {7168, 8, 7168, 8, 7168, 8}, 3), "");
  EXPECT_EQ(detail::first_mismatch(names, {7168, 8, 7168, 6}, 2), "top_k differs (rank 0: 8, rank 1: 6)");
  EXPECT_EQ(detail::first_mismatch(names, {4096, 8, 7168, 6, 7168, 8}, 3),
            "hidden differs (rank 0: 4096, rank 1: 7168, rank 2: 7168)");
  EXPECT_EQ(detail::first_mismatch(names, {1, 2}, 1), "");
  EXPECT_TRUE(contains(error_of([&] { detail::first_mismatch(names, {1, 2, 3}, 2); }), "3 values for 2 ranks"));
}

TEST(CheckCuda, NamesTheCallAndTheError) {
  EXPECT_NO_THROW(check_cuda(cudaSuccess, "cudaMalloc"));
  EXPECT_EQ(error_of([] { check_cuda(cudaErrorInvalidValue, "cudaMemcpy(heap table)"); }),
            "cudaMemcpy(heap table) failed: invalid argument (cudaErrorInvalidValue)");
}

TEST(NcclBootstrap, UniqueIdHexRoundTrips) {
  ncclUniqueId id{};
  for (size_t i = 0; i < sizeof(id.internal); ++i) id.internal[i] = static_cast<char>(i * 37 + 5);
  const std::string hex = unique_id_to_hex(id);
  EXPECT_EQ(hex.size(), 2 * sizeof(id.internal));
  EXPECT_EQ(hex.substr(0, 6), "052a4f");
  const ncclUniqueId back = unique_id_from_hex(hex);
  EXPECT_EQ(std::string(back.internal, sizeof(back.internal)), std::string(id.internal, sizeof(id.internal)));
  EXPECT_TRUE(contains(error_of([] { unique_id_from_hex("abc"); }), "expected 256 hex digits, got 3"));
  std::string bad = hex;
  bad[10] = 'g';
  EXPECT_TRUE(contains(error_of([&] { unique_id_from_hex(bad); }), "at position 10 is not hex"));
}

TEST(NcclBootstrap, UniqueIdFileRoundTripsAndItsAbsenceIsBounded) {
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("caracal_test_id_" + std::to_string(getpid()));
  ncclUniqueId id{};
  id.internal[0] = 'x';
  id.internal[127] = 'y';
  write_unique_id_file(path.string(), id);
  const ncclUniqueId back = read_unique_id_file(path.string(), std::chrono::milliseconds(0));
  EXPECT_EQ(std::string(back.internal, sizeof(back.internal)), std::string(id.internal, sizeof(id.internal)));
  std::filesystem::remove(path);

  const auto start = std::chrono::steady_clock::now();
  const std::string missing = error_of([&] { read_unique_id_file(path.string(), std::chrono::milliseconds(100)); });
  EXPECT_TRUE(contains(missing, "did not appear within 100 ms")) << missing;
  EXPECT_TRUE(contains(missing, path.string())) << missing;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
}

TEST(NcclBootstrap, ReadsTheLaunchersVariables) {
  ScopedEnv rank("RANK", "3");
  ScopedEnv size("WORLD_SIZE", "8");
  {
    ScopedEnv local("LOCAL_RANK", nullptr);
    const ProcessRank p = process_rank_from_env();
    EXPECT_EQ(p.rank, 3);
    EXPECT_EQ(p.world_size, 8);
    EXPECT_EQ(p.device, 3);  // no LOCAL_RANK: a single node
  }
  ScopedEnv local("LOCAL_RANK", "1");
  EXPECT_EQ(process_rank_from_env().device, 1);
}

TEST(NcclBootstrap, ExplainsBadOrMissingVariables) {
  {
    ScopedEnv rank("RANK", nullptr);
    ScopedEnv size("WORLD_SIZE", "2");
    EXPECT_EQ(error_of([] { process_rank_from_env(); }),
              "environment variable RANK is not set (the launcher sets it)");
  }
  {
    ScopedEnv rank("RANK", "two");
    ScopedEnv size("WORLD_SIZE", "2");
    EXPECT_EQ(error_of([] { process_rank_from_env(); }), "environment variable RANK='two' is not a non-negative integer");
  }
  {
    ScopedEnv rank("RANK", "2");
    ScopedEnv size("WORLD_SIZE", "2");
    EXPECT_EQ(error_of([] { process_rank_from_env(); }), "environment variable RANK=2 is not below WORLD_SIZE=2");
  }
  {
    ScopedEnv hex(kUniqueIdEnv, nullptr);
    ScopedEnv file(kUniqueIdFileEnv, nullptr);
    EXPECT_TRUE(contains(error_of([] { unique_id_from_env(1); }), "set CARACAL_NCCL_ID (hex) or CARACAL_NCCL_ID_FILE"));
  }
}

}  // namespace
}  // namespace caracal::comm
