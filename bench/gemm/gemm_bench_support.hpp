#pragma once
// What caracal_gemm_bench's units share: error macros, device arrays, one benchmark case and its
// device inputs.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "caracal/error.hpp"
#include "padded_rows.hpp"

namespace caracal::bench {

#define BENCH_CUDA(expr)                                                                   \
  do {                                                                                     \
    cudaError_t bench_err_ = (expr);                                                       \
    CARACAL_CHECK(bench_err_ == cudaSuccess, #expr, ": ", cudaGetErrorString(bench_err_)); \
  } while (0)

template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t count = 0) { resize(count); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  DeviceArray(DeviceArray&& o) noexcept : ptr_(o.ptr_), count_(o.count_) { o.ptr_ = nullptr; }
  ~DeviceArray() {
    if (ptr_) cudaFree(ptr_);
  }
  void resize(size_t count) {
    if (ptr_) BENCH_CUDA(cudaFree(ptr_));
    ptr_ = nullptr;
    count_ = count;
    if (count) BENCH_CUDA(cudaMalloc(reinterpret_cast<void**>(&ptr_), count * sizeof(T)));
  }
  T* get() const { return ptr_; }
  size_t size() const { return count_; }
  size_t bytes() const { return count_ * sizeof(T); }

 private:
  T* ptr_ = nullptr;
  size_t count_ = 0;
};

using Bf16Array = DeviceArray<__nv_bfloat16>;

// `count` elements from device pointer `p`.
template <typename T>
std::vector<T> download(const T* p, size_t count) {
  std::vector<T> v(count);
  BENCH_CUDA(cudaMemcpy(v.data(), p, count * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}

// bf16 elements from the device, as doubles.
std::vector<double> download_bf16(const __nv_bfloat16* p, size_t count);

struct Case {
  std::string name;  // e.g. "deepseek-v3/uniform"
  std::string model;
  std::string routing;  // uniform | zipf:1 | sparse
  int hidden = 0, intermediate = 0, num_experts = 0, top_k = 0, rank = 0;
  int world = 0, tokens_per_rank = 0;  // the routing the counts are cut from
  std::vector<int> counts;  // per local expert
  int64_t rows() const {
    int64_t r = 0;
    for (int c : counts) r += c;
    return r;
  }
  std::vector<int32_t> offsets() const { return padded_offsets(counts); }
};

// One set of inputs (rotated between when a set would sit in L2).
struct InputSet {
  Bf16Array x, dy, w_gate_up, w_down;
};

}  // namespace caracal::bench
