#include "layer/device_checks.hpp"

#include <algorithm>
#include <string>

#include "caracal/comm/cuda_check.hpp"
#include "caracal/error.hpp"

namespace caracal::layer {

namespace {

const char* memory_type_name(cudaMemoryType type) {
  switch (type) {
    case cudaMemoryTypeUnregistered:
      return "unregistered host memory";
    case cudaMemoryTypeHost:
      return "pinned host memory";
    case cudaMemoryTypeDevice:
      return "device memory";
    case cudaMemoryTypeManaged:
      return "managed memory";
  }
  return "memory of an unknown type";
}

}  // namespace

void check_current_device(int device, const char* fn) {
  int current = -1;
  check_cuda(cudaGetDevice(&current), "cudaGetDevice");
  CARACAL_CHECK(current == device, fn, ": the calling thread's current device must be the world's device ", device,
                ", got ", current, " (cudaSetDevice before calling)");
}

void check_pointer_devices(const std::vector<PointerArg>& args, const std::vector<const void*>& owned, int device,
                           const char* fn, int local_rank) {
  for (const PointerArg& a : args) {
    if (a.ptr == nullptr || std::find(owned.begin(), owned.end(), a.ptr) != owned.end()) continue;
    const std::string where = std::string(fn) + ": ranks[" + std::to_string(local_rank) + "]." + a.name;
    cudaPointerAttributes attributes{};
    const cudaError_t err = cudaPointerGetAttributes(&attributes, a.ptr);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();  // not sticky: clear it for later calls
      throw Error(where + ": cannot query the pointer " + detail::concat(a.ptr) + ": " + cudaGetErrorString(err));
    }
    const bool on_device = attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged;
    CARACAL_CHECK(on_device, where, " must point to device memory of device ", device, " (", a.shape, "), got ",
                  memory_type_name(attributes.type), " at ", a.ptr);
    CARACAL_CHECK(attributes.device == device, where, " must point to memory of device ", device,
                  " (the world's), got memory of device ", attributes.device, " at ", a.ptr);
  }
}

RelaxedCaptureScope::RelaxedCaptureScope() {
  check_cuda(cudaThreadExchangeStreamCaptureMode(&previous_), "cudaThreadExchangeStreamCaptureMode");
}

RelaxedCaptureScope::~RelaxedCaptureScope() { (void)cudaThreadExchangeStreamCaptureMode(&previous_); }

}  // namespace caracal::layer
