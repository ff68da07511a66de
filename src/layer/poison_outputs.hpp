#pragma once
// Poisoning a pass's outputs after a failed wait (src/device/comm/device_sync.cuh): once the world is
// aborted, whatever a pass wrote is incomplete or stale, so every output of it becomes NaN (all
// bytes 0xFF: a NaN in bf16 and in fp32) and no stale number can be used by mistake.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace caracal::layer {

// One output buffer and the abort word of the rank that wrote it.
struct PoisonSpan {
  void* data = nullptr;             // device memory; null spans are skipped
  size_t bytes = 0;
  const uint32_t* abort = nullptr;  // comm::World::abort_word of the rank
};

// Enqueues on `stream` (after the pass): every span whose abort word is set is filled with 0xFF.
// When the world is healthy the kernel reads the words and returns (~3 us per launch). Throws
// caracal::Error if a launch fails.
void poison_if_aborted(const std::vector<PoisonSpan>& spans, cudaStream_t stream);

}  // namespace caracal::layer
