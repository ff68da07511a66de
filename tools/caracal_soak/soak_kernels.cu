#include <cuda_bf16.h>

#include <cstdint>

#include "caracal/comm/cuda_check.hpp"
#include "caracal/error.hpp"
#include "soak_checksum.hpp"
#include "soak_kernels.hpp"

namespace caracal::soak {
namespace {

constexpr int kBlocks = 264;
constexpr int kThreads = 256;

__device__ unsigned long long warp_sum(unsigned long long v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
  return v;
}

__device__ double warp_sum(double v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
  return v;
}

__device__ bool nonfinite_bits(uint32_t bits, bool bf16) {
  return bf16 ? (bits & 0x7F80u) == 0x7F80u : (bits & 0x7F800000u) == 0x7F800000u;
}

__device__ uint32_t element_bits(const void* data, size_t i, bool bf16) {
  return bf16 ? static_cast<const uint16_t*>(data)[i] : static_cast<const uint32_t*>(data)[i];
}

__device__ double element_value(uint32_t bits, bool bf16) {
  return bf16 ? static_cast<double>(__uint_as_float(bits << 16)) : static_cast<double>(__uint_as_float(bits));
}

__global__ void sums_kernel(const unsigned char* data, size_t bytes, bool bf16, BufferSums* out) {
  const size_t first = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  unsigned long long checksum = 0, nonfinite = 0;
  for (size_t i = first; i < checksum_words(bytes); i += stride)
    checksum += checksum_term(checksum_word(data, bytes, i), i);
  const size_t elements = bytes / (bf16 ? 2 : 4);
  for (size_t i = first; i < elements; i += stride) nonfinite += nonfinite_bits(element_bits(data, i, bf16), bf16);
  checksum = warp_sum(checksum);
  nonfinite = warp_sum(nonfinite);
  if (threadIdx.x % 32 == 0) {
    atomicAdd(&out->checksum, checksum);
    atomicAdd(&out->nonfinite, nonfinite);
  }
}

__global__ void comparison_kernel(const void* b, const void* ref, size_t elements, bool bf16, BufferComparison* out) {
  unsigned long long differing = 0;
  double err2 = 0.0, ref2 = 0.0;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < elements;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const uint32_t got = element_bits(b, i, bf16), want = element_bits(ref, i, bf16);
    differing += got != want;
    const double r = element_value(want, bf16), d = element_value(got, bf16) - r;
    err2 += d * d;
    ref2 += r * r;
  }
  differing = warp_sum(differing);
  err2 = warp_sum(err2);
  ref2 = warp_sum(ref2);
  if (threadIdx.x % 32 == 0) {
    atomicAdd(&out->differing, differing);
    atomicAdd(&out->err2, err2);
    atomicAdd(&out->ref2, ref2);
  }
}

}  // namespace

void enqueue_sums(const OutputBuffer& b, BufferSums* sums, cudaStream_t stream) {
  sums_kernel<<<kBlocks, kThreads, 0, stream>>>(static_cast<const unsigned char*>(b.data), b.bytes, b.bf16, sums);
  check_cuda(cudaGetLastError(), "caracal-soak: checksum kernel");
}

void enqueue_comparison(const OutputBuffer& b, const OutputBuffer& reference, BufferComparison* out,
                        cudaStream_t stream) {
  CARACAL_CHECK(b.bytes == reference.bytes && b.bf16 == reference.bf16, "caracal-soak: comparing ", b.name, " (",
                b.bytes, " bytes) with ", reference.name, " (", reference.bytes, " bytes) of another type or size");
  comparison_kernel<<<kBlocks, kThreads, 0, stream>>>(b.data, reference.data, b.elements(), b.bf16, out);
  check_cuda(cudaGetLastError(), "caracal-soak: comparison kernel");
}

}  // namespace caracal::soak
