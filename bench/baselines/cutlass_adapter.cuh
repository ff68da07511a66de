#pragma once
// What the CUTLASS grouped-GEMM baselines share around CUTLASS's device adapter `Gemm`: device
// copies of their per-group arrays, the epilogue's D = A · B^T arguments (alpha 1, beta 0: C is
// never read), and the adapter's can_implement / workspace / initialize / run, each failure a
// caracal::Error naming `what`.
#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>

#include <cstdint>
#include <vector>

#include "caracal/comm/cuda_check.hpp"
#include "caracal/comm/cuda_memory.hpp"
#include "caracal/error.hpp"

namespace caracal::bench::cutlass_baseline {

template <typename T>
comm::DeviceMemory<T> upload(const std::vector<T>& host, const char* what) {
  comm::DeviceMemory<T> device = comm::device_alloc<T>(host.size(), what);
  check_cuda(cudaMemcpy(device.get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), what);
  return device;
}

template <class Gemm>
class CutlassAdapter {
 public:
  using Arguments = typename Gemm::Arguments;

  // The epilogue's fusion arguments of a plain product: D = 1 * accumulators + 0 * C.
  static auto plain_product() {
    decltype(Arguments{}.epilogue.thread) fusion;
    fusion.alpha = 1.0f;
    fusion.beta = 0.0f;
    fusion.alpha_ptr = nullptr;
    fusion.beta_ptr = nullptr;
    fusion.alpha_ptr_array = nullptr;
    fusion.beta_ptr_array = nullptr;
    fusion.dAlpha = {cute::_0{}, cute::_0{}, 0};
    fusion.dBeta = {cute::_0{}, cute::_0{}, 0};
    return fusion;
  }

  // This device's hardware info for the kernel (its SM count).
  static cutlass::KernelHardwareInfo hardware() {
    int device = 0;
    check_cuda(cudaGetDevice(&device), "cudaGetDevice");
    return cutlass::KernelHardwareInfo::make_kernel_hardware_info<typename Gemm::GemmKernel>(device);
  }

  void initialize(const Arguments& args, int n, int k, const char* what) {
    CARACAL_CHECK(gemm_.can_implement(args) == cutlass::Status::kSuccess, what,
                  ": the grouped GEMM cannot implement N = ", n, ", K = ", k);
    const size_t workspace_bytes = Gemm::get_workspace_size(args);
    workspace_ = comm::device_alloc<uint8_t>(workspace_bytes > 0 ? workspace_bytes : 1, what);
    CARACAL_CHECK(gemm_.initialize(args, workspace_.get()) == cutlass::Status::kSuccess, what, ": initialize failed");
  }

  void run(cudaStream_t stream, const char* what) {
    const cutlass::Status status = gemm_.run(stream);
    CARACAL_CHECK(status == cutlass::Status::kSuccess, what, ": run failed: ", cutlassGetStatusString(status));
    check_cuda(cudaGetLastError(), what);
  }

 private:
  comm::DeviceMemory<uint8_t> workspace_;
  Gemm gemm_;
};

}  // namespace caracal::bench::cutlass_baseline
