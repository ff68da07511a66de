#pragma once
// Helpers shared by the GPU tests: the gate that decides whether a GPU test runs, skips or fails,
// and a stream.
//
// A GPU test skips only where it cannot run: no CUDA device at all ("skipped: no GPU"), a device
// that is not a Hopper GPU ("skipped: no Hopper GPU"), or fewer GPUs than it needs ("skipped: needs
// N GPUs"). Every skip message starts with "skipped: ", which CTest reports as a skip (not a pass).
// Anything else is a failure: a CUDA driver that is installed but does not answer (a broken or
// mismatched driver must never look green). Where the machine is meant to run them,
//   CARACAL_REQUIRE_GPU=1    turns the "no GPU" and "no Hopper GPU" skips into failures;
//   CARACAL_REQUIRE_GPUS=N   turns "needs M GPUs" into a failure for every M <= N.
// The GPU check scripts set both (N = the GPUs the machine has).
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "caracal/comm/cuda_check.hpp"

namespace caracal::test {

// The integer in environment variable `name`, or 0 when it is unset or not a number.
inline int env_count(const char* name) {
  const char* text = std::getenv(name);
  return text != nullptr ? std::atoi(text) : 0;
}

// Why the GPU tests cannot run here ("no GPU", ...), "" when a Hopper GPU is usable, or a message
// starting with "error: " when CUDA is installed but broken. (Only skips print "skipped: ": CTest
// takes any output holding it for a skip, so failure messages must not.)
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

}  // namespace caracal::test

// Skips the calling test, visibly, where no Hopper GPU is present; fails it where CUDA is broken
// or CARACAL_REQUIRE_GPU=1 says this machine must run it.
#define CARACAL_REQUIRE_GPU()                                                                    \
  do {                                                                                           \
    const std::string caracal_reason_ = ::caracal::test::gpu_skip_reason();                      \
    if (caracal_reason_.rfind("error: ", 0) == 0) FAIL() << caracal_reason_;                     \
    if (!caracal_reason_.empty()) {                                                              \
      if (::caracal::test::env_count("CARACAL_REQUIRE_GPU") != 0)                                \
        FAIL() << "CARACAL_REQUIRE_GPU=1 but this machine has " << caracal_reason_;              \
      GTEST_SKIP() << "skipped: " << caracal_reason_;                                            \
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
      if (::caracal::test::env_count("CARACAL_REQUIRE_GPUS") >= (n))                             \
        FAIL() << "CARACAL_REQUIRE_GPUS says this machine has " << (n) << " GPUs: " << caracal_need_; \
      GTEST_SKIP() << "skipped: " << caracal_need_;                                              \
    }                                                                                            \
  } while (0)

// Asserts that a CUDA runtime call succeeded, with the error string on failure.
#define CARACAL_ASSERT_CUDA(expr)                                              \
  do {                                                                         \
    cudaError_t caracal_err_ = (expr);                                         \
    ASSERT_EQ(caracal_err_, cudaSuccess) << #expr << ": " << cudaGetErrorString(caracal_err_); \
  } while (0)
