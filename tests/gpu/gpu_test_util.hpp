#pragma once
// Helpers shared by the GPU tests: the gate that decides whether a GPU test runs, skips or fails,
// seeds, a stream, a CUDA graph, a device buffer and one host thread per GPU.
//
// A GPU test skips only where it cannot run: no CUDA device at all ("CARACAL_SKIPPED: no GPU"), a
// device that is not a Hopper GPU ("CARACAL_SKIPPED: no Hopper GPU"), or fewer GPUs than it needs
// ("CARACAL_SKIPPED: needs N GPUs"). Every skip message starts with CARACAL_SKIP_MARKER
// (gpu_requirements.hpp), which CTest reports as a skip (not a pass). Anything else is a failure: a
// CUDA driver that is installed but does not answer (a broken or mismatched driver must never look
// green). Where the machine is meant to run them,
//   CARACAL_REQUIRE_GPU=1    turns the "no GPU" and "no Hopper GPU" skips into failures;
//   CARACAL_REQUIRE_GPUS=N   turns "needs M GPUs" into a failure for every M <= N;
// any other value of either fails every GPU test (gpu_requirements.hpp lists what is accepted).
// The GPU check scripts set both (N = the GPUs the machine has).
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "caracal/comm/cuda_check.hpp"
#include "cuda_graph.hpp"  // bench/
#include "fresh_seed.hpp"
#include "gpu_requirements.hpp"

namespace caracal::test {

// Why the GPU tests cannot run here ("no GPU", ...), "" when a Hopper GPU is usable, or a message
// starting with "error: " when CUDA is installed but broken. (Only skips print CARACAL_SKIP_MARKER:
// CTest takes any output holding it for a skip, so failure messages must not.)
inline std::string gpu_skip_reason() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) (void)cudaGetLastError();  // not sticky, but keep later calls clean
  if (err == cudaErrorNoDevice || (err == cudaSuccess && count == 0)) return "no GPU";
  if (err == cudaErrorInsufficientDriver) {
    // Without a driver library there is no GPU to use; with one, the driver is too old or broken.
    void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (driver == nullptr) return "no GPU (no CUDA driver installed)";
    dlclose(driver);
  }
  if (err != cudaSuccess) {
    return std::string("error: a CUDA driver is installed but cudaGetDeviceCount failed: ") +
           cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")";
  }
  cudaDeviceProp prop{};
  const cudaError_t props = cudaGetDeviceProperties(&prop, 0);
  if (props != cudaSuccess) return std::string("error: cudaGetDeviceProperties(0) failed: ") + cudaGetErrorName(props);
  if (prop.major != 9 || prop.minor != 0) {
    return "no Hopper GPU (the kernels are sm_90a; device 0 is " + std::string(prop.name) + ", sm_" +
           std::to_string(prop.major) + std::to_string(prop.minor) + ")";
  }
  return "";
}

// The number of CUDA devices (0 when there are none; never throws).
inline int gpu_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

inline std::string seed_note(uint64_t seed) {
  return "seed " + std::to_string(seed) + " (rerun with CARACAL_TEST_SEED=" + std::to_string(seed) + ")";
}

// A fresh seed that every failure reported while this object lives names, after `context`.
class TracedSeed {
 public:
  explicit TracedSeed(const std::string& context = "")
      : seed_(fresh_seed()), trace_(__FILE__, __LINE__, context + seed_note(seed_)) {}
  uint64_t value() const { return seed_; }

 private:
  uint64_t seed_;
  ::testing::ScopedTrace trace_;
};

// A non-blocking stream, destroyed with the object.
class Stream {
 public:
  Stream() { check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags"); }
  ~Stream() { (void)cudaStreamDestroy(stream_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }
  void sync() const { check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }

 private:
  cudaStream_t stream_ = nullptr;
};

// What `enqueue(stream)` enqueues on `stream`, captured into a CUDA graph and instantiated, to be
// launched any number of times (bench/baselines/cuda_graph.hpp, over the tests' Stream).
class CapturedGraph : public bench::CapturedGraph {
 public:
  template <typename Enqueue>
  CapturedGraph(const Stream& stream, Enqueue enqueue) : bench::CapturedGraph(stream.get(), enqueue) {}
  void launch(const Stream& stream) const { bench::CapturedGraph::launch(stream.get()); }
};

// Owns one device allocation (at least one element, so that an empty buffer is still a valid
// pointer); failures are fatal to the calling test function (wrap in ASSERT_NO_FATAL_FAILURE).
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
  void allocate(size_t count) {
    count_ = count;
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&ptr_), std::max<size_t>(count, 1) * sizeof(T)),
              cudaSuccess);
  }
  void upload(const std::vector<T>& host) {
    allocate(host.size());
    ASSERT_EQ(cudaMemcpy(ptr_, host.data(), bytes(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  void download(std::vector<T>& host) const {
    host.resize(count_);
    ASSERT_EQ(cudaMemcpy(host.data(), ptr_, bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
  }
  // All-ones bytes: NaN in bf16 and fp32 buffers.
  void poison() { ASSERT_EQ(cudaMemset(ptr_, 0xFF, bytes()), cudaSuccess); }
  T* get() const { return ptr_; }
  size_t bytes() const { return count_ * sizeof(T); }

 private:
  T* ptr_ = nullptr;
  size_t count_ = 0;
};

// Runs body(rank) for ranks 0 .. ranks-1 at once, one thread each with GPU `rank` current (NCCL
// worlds are built by all their ranks together). Each rank's failure: the message of what body
// threw, "" where it returned.
template <typename Body>
std::vector<std::string> on_each_gpu(int ranks, Body body) {
  std::vector<std::string> failures(static_cast<size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      try {
        check_cuda(cudaSetDevice(r), "cudaSetDevice");
        body(r);
      } catch (const std::exception& e) {
        failures[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return failures;
}

}  // namespace caracal::test

// Skips the calling test, visibly, where no Hopper GPU is present; fails it where CUDA is broken,
// CARACAL_REQUIRE_GPU=1 says this machine must run it, or a CARACAL_REQUIRE_GPU(S) value is refused.
#define CARACAL_REQUIRE_GPU()                                                                    \
  do {                                                                                           \
    const ::caracal::test::GpuRequirements caracal_required_ = ::caracal::test::gpu_requirements(); \
    if (!caracal_required_.error.empty()) FAIL() << caracal_required_.error;                     \
    const std::string caracal_reason_ = ::caracal::test::gpu_skip_reason();                      \
    if (caracal_reason_.rfind("error: ", 0) == 0) FAIL() << caracal_reason_;                     \
    if (!caracal_reason_.empty()) {                                                              \
      if (caracal_required_.gpu) FAIL() << "CARACAL_REQUIRE_GPU=1 but this machine has " << caracal_reason_; \
      GTEST_SKIP() << CARACAL_SKIP_MARKER << caracal_reason_;                                    \
    }                                                                                            \
  } while (0)

// CARACAL_REQUIRE_GPU, then skips visibly with fewer than `n` GPUs (fails instead where
// CARACAL_REQUIRE_GPUS >= n says the machine has them).
#define CARACAL_REQUIRE_GPUS(n)                                                                  \
  do {                                                                                           \
    CARACAL_REQUIRE_GPU();                                                                       \
    const int caracal_found_ = ::caracal::test::gpu_count();                                     \
    if (caracal_found_ < (n)) {                                                                  \
      const std::string caracal_need_ =                                                          \
          "needs " + std::to_string(n) + " GPUs, found " + std::to_string(caracal_found_);        \
      if (::caracal::test::gpu_requirements().gpus >= (n))                                       \
        FAIL() << "CARACAL_REQUIRE_GPUS says this machine has " << (n) << " GPUs: " << caracal_need_; \
      GTEST_SKIP() << CARACAL_SKIP_MARKER << caracal_need_;                                      \
    }                                                                                            \
  } while (0)

// Asserts that a CUDA runtime call succeeded, with the error string on failure.
#define CARACAL_ASSERT_CUDA(expr)                                              \
  do {                                                                         \
    cudaError_t caracal_err_ = (expr);                                         \
    ASSERT_EQ(caracal_err_, cudaSuccess) << #expr << ": " << cudaGetErrorString(caracal_err_); \
  } while (0)
