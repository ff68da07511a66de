#pragma once
// The soak's device-side reductions over an output buffer, enqueued on a stream: its checksum
// (soak_checksum.hpp) and count of non-finite elements, and its comparison with another buffer of
// the same output (another path's). Results land in device slots the caller zeroed first.
#include <cuda_runtime.h>

#include <cstddef>

namespace caracal::soak {

// One output buffer of one rank: bf16 or fp32 elements.
struct OutputBuffer {
  const char* name = "";
  const void* data = nullptr;
  size_t bytes = 0;
  bool bf16 = false;
  size_t elements() const { return bytes / (bf16 ? 2 : 4); }
};

struct BufferSums {
  unsigned long long checksum;   // soak_checksum.hpp
  unsigned long long nonfinite;  // elements that are NaN or infinite
};

// `b` against `reference`: elements whose bits differ, and sum (b - ref)^2, sum ref^2 over all of
// them (NaN when either holds a NaN).
struct BufferComparison {
  unsigned long long differing;
  double err2;
  double ref2;
};

void enqueue_sums(const OutputBuffer& b, BufferSums* sums, cudaStream_t stream);
void enqueue_comparison(const OutputBuffer& b, const OutputBuffer& reference, BufferComparison* out,
                        cudaStream_t stream);

}  // namespace caracal::soak
