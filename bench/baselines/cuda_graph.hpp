#pragma once
// A CUDA graph captured once from the work a function enqueues on a stream, then replayed: the
// benchmarks time replays (no host work in the timed runs) and the tests check that the layer's
// passes replay with new inputs. Thread-local capture mode: with one thread per GPU, the other
// threads keep making calls that a global-mode capture forbids process-wide (cudaMalloc,
// cudaDeviceSynchronize, NCCL's setup and teardown); under global mode those fail and invalidate
// the capture, and NCCL, getting such errors in the middle of its teardown, crashed the process
// now and then.
#include <cuda_runtime.h>

#include <functional>

#include "caracal/comm/cuda_check.hpp"

namespace caracal::bench {

class CapturedGraph {
 public:
  // Captures what enqueue(stream) enqueues on `stream`. Throws caracal::Error if the capture fails;
  // an exception from `enqueue` ends the capture and propagates.
  CapturedGraph(cudaStream_t stream, const std::function<void(cudaStream_t)>& enqueue) {
    cudaGraph_t graph = nullptr;
    check_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    try {
      enqueue(stream);
    } catch (...) {
      if (cudaStreamEndCapture(stream, &graph) == cudaSuccess && graph != nullptr) (void)cudaGraphDestroy(graph);
      throw;
    }
    check_cuda(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
    const cudaError_t instantiated = cudaGraphInstantiate(&exec_, graph, 0);
    (void)cudaGraphDestroy(graph);
    check_cuda(instantiated, "cudaGraphInstantiate");
  }
  ~CapturedGraph() {
    if (exec_ != nullptr) (void)cudaGraphExecDestroy(exec_);
  }
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;

  void launch(cudaStream_t stream) const { check_cuda(cudaGraphLaunch(exec_, stream), "cudaGraphLaunch"); }

 private:
  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace caracal::bench
