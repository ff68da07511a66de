// The same exchange through NcclWorld: one rank on one GPU (W = 1), the process-per-GPU bootstrap
// through the launcher's variables, and, where a machine has several GPUs, one thread per GPU.
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <unistd.h>

#include "caracal/comm/nccl_bootstrap.hpp"
#include "caracal/comm/nccl_world.hpp"
#include "caracal/error.hpp"
#include "comm_test_support.hpp"
#include "gpu_test_util.hpp"

namespace caracal::test {
namespace {

using comm::NcclWorld;

constexpr size_t kHeapBytes = size_t(1) << 20;
constexpr size_t kWords = 16 * 1024;

// Runs the exchange on `world`: plain launches, then graph replays.
void exchange_through(NcclWorld& world) {
  Exchange exchange(world, kWords);
  Stream stream;
  for (int i = 0; i < 3; ++i) launch_exchange(world, exchange.buffers(), 4, 20, stream.get());
  stream.sync();
  replay_graph(stream, 3, [&](cudaStream_t s) { launch_exchange(world, exchange.buffers(), 4, 20, s); });
  EXPECT_NO_THROW(world.check());
  exchange.expect_clean(6);
}

// Sets an environment variable for the lifetime of the object, restoring the previous value.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_.empty()) {
      unsetenv(name_);
    } else {
      setenv(name_, old_.c_str(), 1);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::string old_;
};

TEST(NcclWorld, SingleRankExchange) {
  CARACAL_REQUIRE_GPU();
  std::vector<comm::NcclComm> comms = comm::init_all({0});
  NcclWorld world(comms[0].get(), kHeapBytes);
  EXPECT_EQ(world.world_size(), 1);
  EXPECT_EQ(world.rank(), 0);
  exchange_through(world);
}

TEST(NcclWorld, ProcessBootstrapThroughAnIdFile) {
  CARACAL_REQUIRE_GPU();
  // What a launcher does for a one-process job: rank variables and a fresh id file path, which
  // rank 0 fills.
  const std::string path =
      (std::filesystem::temp_directory_path() / ("caracal_nccl_id_" + std::to_string(getpid()))).string();
  std::filesystem::remove(path);
  ScopedEnv rank("RANK", "0");
  ScopedEnv size("WORLD_SIZE", "1");
  ScopedEnv local("LOCAL_RANK", "0");
  ScopedEnv file(comm::kUniqueIdFileEnv, path);
  {
    comm::NcclComm comm = comm::init_process_from_env();
    EXPECT_TRUE(std::filesystem::exists(path));
    NcclWorld world(comm.get(), kHeapBytes);
    exchange_through(world);
  }
  std::filesystem::remove(path);
}

TEST(NcclWorld, ProcessBootstrapThroughAHexId) {
  CARACAL_REQUIRE_GPU();
  ScopedEnv rank("RANK", "0");
  ScopedEnv size("WORLD_SIZE", "1");
  ScopedEnv local("LOCAL_RANK", "0");
  ScopedEnv id(comm::kUniqueIdEnv, comm::unique_id_to_hex(comm::new_unique_id()));
  comm::NcclComm comm = comm::init_process_from_env();
  NcclWorld world(comm.get(), kHeapBytes);
  exchange_through(world);
}

TEST(NcclWorld, ThreadPerGpuExchange) {
  CARACAL_REQUIRE_GPUS(2);
  const int devices = gpu_count();
  std::vector<int> ids(static_cast<size_t>(devices));
  for (int d = 0; d < devices; ++d) ids[static_cast<size_t>(d)] = d;
  std::vector<comm::NcclComm> comms = comm::init_all(ids);
  const std::vector<std::string> failures = on_each_gpu(devices, [&](int r) {
    NcclWorld world(comms[static_cast<size_t>(r)].get(), kHeapBytes);  // collective: all threads construct together
    EXPECT_EQ(world.rank(), r);
    exchange_through(world);
  });
  for (size_t r = 0; r < failures.size(); ++r) EXPECT_EQ(failures[r], "") << "rank " << r;
}

}  // namespace
}  // namespace caracal::test
