#pragma once
// Turns a failed CUDA runtime call into caracal::Error naming the call and CUDA's error string.
#include <cuda_runtime.h>

#include "caracal/error.hpp"

namespace caracal {

// Throws caracal::Error("<what> failed: <error string> (<error name>)") unless err is cudaSuccess.
inline void check_cuda(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return;
  throw Error(detail::concat(what, " failed: ", cudaGetErrorString(err), " (", cudaGetErrorName(err), ")"));
}

}  // namespace caracal
