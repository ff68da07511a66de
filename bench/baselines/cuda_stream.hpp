#pragma once
// A non-blocking CUDA stream on the current device, for the benchmarks and tools.
#include <cuda_runtime.h>

namespace caracal::bench {

class Stream {
 public:
  Stream();
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }
  void sync() const;

 private:
  cudaStream_t stream_ = nullptr;
};

}  // namespace caracal::bench
