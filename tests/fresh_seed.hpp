#pragma once
// The seed of the tests' random inputs, shared by the unit and the GPU tests.
#include <cstdint>
#include <cstdlib>
#include <random>

namespace caracal::test {

// A fresh seed per run, or CARACAL_TEST_SEED to replay a failure (tests print theirs).
inline uint64_t fresh_seed() {
  if (const char* fixed = std::getenv("CARACAL_TEST_SEED")) return std::strtoull(fixed, nullptr, 0);
  std::random_device device;
  return (static_cast<uint64_t>(device()) << 32) ^ device();
}

}  // namespace caracal::test
