#pragma once
// Timing for the benchmarks: the median of CUDA-event-bracketed runs on one stream.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <functional>
#include <vector>

#include "caracal/comm/cuda_check.hpp"

namespace caracal::bench {

// Milliseconds of the median of `reps` runs of run(), each between two events recorded on
// `stream`, after `warmup` untimed runs. Runs are enqueued back to back, so a run that never
// blocks the host is timed without its launch overhead, and one that synchronizes half way (the
// NCCL baseline) includes the time the stream idles while the host waits.
inline double median_ms(cudaStream_t stream, int warmup, int reps, const std::function<void()>& run) {
  for (int i = 0; i < warmup; ++i) run();
  std::vector<cudaEvent_t> start(static_cast<size_t>(reps)), stop(static_cast<size_t>(reps));
  for (size_t i = 0; i < start.size(); ++i) {
    check_cuda(cudaEventCreate(&start[i]), "cudaEventCreate");
    check_cuda(cudaEventCreate(&stop[i]), "cudaEventCreate");
  }
  for (size_t i = 0; i < start.size(); ++i) {
    check_cuda(cudaEventRecord(start[i], stream), "cudaEventRecord");
    run();
    check_cuda(cudaEventRecord(stop[i], stream), "cudaEventRecord");
  }
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize(timing)");
  std::vector<float> ms(start.size());
  for (size_t i = 0; i < start.size(); ++i) {
    check_cuda(cudaEventElapsedTime(&ms[i], start[i], stop[i]), "cudaEventElapsedTime");
    (void)cudaEventDestroy(start[i]);
    (void)cudaEventDestroy(stop[i]);
  }
  std::nth_element(ms.begin(), ms.begin() + static_cast<std::ptrdiff_t>(ms.size() / 2), ms.end());
  return static_cast<double>(ms[ms.size() / 2]);
}

}  // namespace caracal::bench
