#pragma once
// Timing for the benchmarks: CUDA-event-bracketed runs on one stream, after a warm-up long enough
// for the clocks and caches to settle.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <functional>
#include <vector>

#include "caracal/comm/cuda_check.hpp"

namespace caracal::bench {

struct RunTimes {
  double min_ms = 0, median_ms = 0, max_ms = 0;
};

// min, median and max of `ms` (not empty).
inline RunTimes summarize(std::vector<double> ms) {
  std::sort(ms.begin(), ms.end());
  const size_t n = ms.size();
  RunTimes t;
  t.min_ms = ms.front();
  t.max_ms = ms.back();
  t.median_ms = n % 2 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]);
  return t;
}

// Warm-up: at least `warmup` untimed runs and at least `warmup_ms` of them (a GPU coming out of
// idle needs tens of milliseconds of work to reach its boost clock; a few runs of a short kernel
// are not enough). Then `reps` runs of run(iteration), each between two events recorded on
// `stream`; returns their times in ms, in run order. Runs are enqueued back to back, so a run that
// never blocks the host is timed without its launch overhead, and one that synchronizes half way
// (the NCCL baseline) includes the time the stream idles while the host waits. `iteration` counts
// from `first_iteration` over warm-up and timed runs (benchmarks rotate input buffers with it).
// `prepare`, when given, is enqueued before every run, outside its events (the state a run
// consumes, such as the forward a backward needs).
inline std::vector<double> time_samples(cudaStream_t stream, int warmup, int reps, const std::function<void(int)>& run,
                                        double warmup_ms = 200.0, int first_iteration = 0,
                                        const std::function<void()>& prepare = {}) {
  int iteration = first_iteration;
  cudaEvent_t begin, end;
  check_cuda(cudaEventCreate(&begin), "cudaEventCreate");
  check_cuda(cudaEventCreate(&end), "cudaEventCreate");
  float warmed_ms = 0;
  for (int batch = std::max(warmup, 1); iteration - first_iteration < warmup || warmed_ms < warmup_ms; batch *= 2) {
    check_cuda(cudaEventRecord(begin, stream), "cudaEventRecord");
    for (int i = 0; i < batch; ++i) {
      if (prepare) prepare();
      run(iteration++);
    }
    check_cuda(cudaEventRecord(end, stream), "cudaEventRecord");
    check_cuda(cudaEventSynchronize(end), "cudaEventSynchronize(warm-up)");
    float ms = 0;
    check_cuda(cudaEventElapsedTime(&ms, begin, end), "cudaEventElapsedTime");
    warmed_ms += ms;
  }
  (void)cudaEventDestroy(begin);
  (void)cudaEventDestroy(end);

  std::vector<cudaEvent_t> start(static_cast<size_t>(reps)), stop(static_cast<size_t>(reps));
  for (size_t i = 0; i < start.size(); ++i) {
    check_cuda(cudaEventCreate(&start[i]), "cudaEventCreate");
    check_cuda(cudaEventCreate(&stop[i]), "cudaEventCreate");
  }
  for (size_t i = 0; i < start.size(); ++i) {
    if (prepare) prepare();
    check_cuda(cudaEventRecord(start[i], stream), "cudaEventRecord");
    run(iteration++);
    check_cuda(cudaEventRecord(stop[i], stream), "cudaEventRecord");
  }
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize(timing)");
  std::vector<double> ms(start.size());
  for (size_t i = 0; i < start.size(); ++i) {
    float t = 0;
    check_cuda(cudaEventElapsedTime(&t, start[i], stop[i]), "cudaEventElapsedTime");
    ms[i] = static_cast<double>(t);
    (void)cudaEventDestroy(start[i]);
    (void)cudaEventDestroy(stop[i]);
  }
  return ms;
}

inline RunTimes time_runs(cudaStream_t stream, int warmup, int reps, const std::function<void(int)>& run,
                          double warmup_ms = 200.0) {
  return summarize(time_samples(stream, warmup, reps, run, warmup_ms));
}

// The median of time_runs for a run that does not need its iteration number.
inline double median_ms(cudaStream_t stream, int warmup, int reps, const std::function<void()>& run) {
  return time_runs(stream, warmup, reps, [&](int) { run(); }).median_ms;
}

}  // namespace caracal::bench
