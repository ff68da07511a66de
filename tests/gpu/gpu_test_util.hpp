#pragma once
// Helpers shared by the GPU tests.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "caracal/comm/cuda_check.hpp"

namespace caracal::test {

// True when a CUDA device of compute capability 9.0 (Hopper) is usable.
inline bool hopper_gpu_available() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();  // clear the sticky "no device" error
    return false;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return false;
  return prop.major == 9 && prop.minor == 0;
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

// Skips the calling test, visibly, where no Hopper GPU is present.
#define CARACAL_REQUIRE_GPU()                                                  \
  do {                                                                         \
    if (!::caracal::test::hopper_gpu_available())                              \
      GTEST_SKIP() << "skipped: no GPU (needs a Hopper sm_90 device)";         \
  } while (0)

// Asserts that a CUDA runtime call succeeded, with the error string on failure.
#define CARACAL_ASSERT_CUDA(expr)                                              \
  do {                                                                         \
    cudaError_t caracal_err_ = (expr);                                         \
    ASSERT_EQ(caracal_err_, cudaSuccess) << #expr << ": " << cudaGetErrorString(caracal_err_); \
  } while (0)
