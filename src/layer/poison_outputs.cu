#include "layer/poison_outputs.hpp"

#include <algorithm>

#include "caracal/comm/cuda_check.hpp"

namespace caracal::layer {

namespace {

constexpr int kSpansPerLaunch = 32;  // 24 bytes each: the parameters stay far below 4 KiB
constexpr int kThreads = 256;
constexpr int kBlocks = 264;  // two per SM: a few GB of gradients fill in a few ms on the rare failure

struct PoisonParams {
  PoisonSpan spans[kSpansPerLaunch];
  int count = 0;
};

__global__ void poison_kernel(PoisonParams params) {
  const size_t first = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (int s = 0; s < params.count; ++s) {
    const PoisonSpan& span = params.spans[s];
    if (*static_cast<const volatile uint32_t*>(span.abort) == 0) continue;
    unsigned char* bytes = static_cast<unsigned char*>(span.data);
    // Spans are 16-byte aligned except for small tails of fp32 arrays: vectors, then bytes.
    const size_t vectors = reinterpret_cast<uintptr_t>(bytes) % 16 == 0 ? span.bytes / 16 : 0;
    uint4* vec = reinterpret_cast<uint4*>(bytes);
    for (size_t i = first; i < vectors; i += stride) vec[i] = make_uint4(~0u, ~0u, ~0u, ~0u);
    for (size_t i = vectors * 16 + first; i < span.bytes; i += stride) bytes[i] = 0xFF;
  }
}

}  // namespace

void poison_if_aborted(const std::vector<PoisonSpan>& spans, cudaStream_t stream) {
  PoisonParams params;
  for (const PoisonSpan& span : spans) {
    if (span.data == nullptr || span.bytes == 0) continue;
    params.spans[params.count++] = span;
    if (params.count == kSpansPerLaunch) {
      poison_kernel<<<kBlocks, kThreads, 0, stream>>>(params);
      check_cuda(cudaGetLastError(), "MoELayer: poison kernel launch");
      params.count = 0;
    }
  }
  if (params.count == 0) return;
  poison_kernel<<<kBlocks, kThreads, 0, stream>>>(params);
  check_cuda(cudaGetLastError(), "MoELayer: poison kernel launch");
}

}  // namespace caracal::layer
