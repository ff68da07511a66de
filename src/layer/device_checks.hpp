#pragma once
// The argument checks that ask the CUDA runtime: the calling thread's device and where each
// pointer lives. Pointer queries touch no stream, so they are allowed while a stream is captured.
#include <cuda_runtime.h>

#include <vector>

#include "layer/argument_checks.hpp"

namespace caracal::layer {

// Throws caracal::Error unless the calling thread's current device is `device`.
void check_current_device(int device, const char* fn);

// Every non-null pointer of `args` other than the layer's own buffers (`owned`: the zero-copy
// path) must be device (or managed) memory of `device`. Throws caracal::Error naming it.
void check_pointer_devices(const std::vector<PointerArg>& args, const std::vector<const void*>& owned, int device,
                           const char* fn, int local_rank);

// Puts the calling thread in relaxed stream-capture mode for its lifetime. The layer's calls make
// no stream-synchronizing API calls; relaxed mode keeps a global-mode capture of the caller's
// from refusing the harmless queries among them (pointer attributes, function attributes).
class RelaxedCaptureScope {
 public:
  RelaxedCaptureScope();
  ~RelaxedCaptureScope();
  RelaxedCaptureScope(const RelaxedCaptureScope&) = delete;
  RelaxedCaptureScope& operator=(const RelaxedCaptureScope&) = delete;

 private:
  cudaStreamCaptureMode previous_ = cudaStreamCaptureModeRelaxed;
};

}  // namespace caracal::layer
