#pragma once
// The checksum of one output buffer, the same on the device (soak_kernels.cu) and the host (tests):
// the buffer read as little-endian 8-byte words, the last one padded with zero bytes when the byte
// count is not a multiple of 8 (fp32 d_topk_scores with T·k odd), and
//     sum over words i of word_i * (2i + 1)   (mod 2^64).
// Integer sums commute, so the device's atomics give the same value in any order; any changed bit,
// the tail's included, changes it. A buffer whose byte count is a multiple of 8 has the checksum it
// had before the tail was counted.
#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define CARACAL_SOAK_HD __host__ __device__
#else
#define CARACAL_SOAK_HD
#endif

namespace caracal::soak {

CARACAL_SOAK_HD inline size_t checksum_words(size_t bytes) { return (bytes + 7) / 8; }

// Word i of `bytes` bytes at `data` (8-byte aligned): whole, or the tail's bytes and zeros.
CARACAL_SOAK_HD inline uint64_t checksum_word(const unsigned char* data, size_t bytes, size_t i) {
  const size_t at = i * 8;
  if (at + 8 <= bytes) {
#if defined(__CUDA_ARCH__)
    return *reinterpret_cast<const uint64_t*>(data + at);
#else
    uint64_t word;
    std::memcpy(&word, data + at, sizeof word);
    return word;
#endif
  }
  uint64_t word = 0;
  for (size_t b = 0; at + b < bytes; ++b) word |= static_cast<uint64_t>(data[at + b]) << (8 * b);
  return word;
}

CARACAL_SOAK_HD inline uint64_t checksum_term(uint64_t word, size_t i) {
  return word * (2ull * static_cast<uint64_t>(i) + 1ull);
}

// The whole checksum on the host (the device's value, for tests).
inline uint64_t host_checksum(const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t sum = 0;
  for (size_t i = 0; i < checksum_words(bytes); ++i) sum += checksum_term(checksum_word(p, bytes, i), i);
  return sum;
}

}  // namespace caracal::soak
