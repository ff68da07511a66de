#pragma once
// What a GPU test's skip prints, and what CARACAL_REQUIRE_GPU / CARACAL_REQUIRE_GPUS ask of the GPU
// tests, read strictly: a value that means something else must fail loudly, never skip. Host-only
// (no CUDA), so that a unit test can check it anywhere.
//   CARACAL_REQUIRE_GPU    unset, empty or "0": skips stay skips; "1": the GPU tests must run.
//   CARACAL_REQUIRE_GPUS   unset or empty: 0; else a non-negative decimal integer N: a test that
//                          needs M <= N GPUs must run.
// tests/python/gpu_requirements.py reads them the same way.
#include <climits>
#include <cstdlib>
#include <string>

// Starts every skip message of the GPU tests: CTest's SKIP_REGULAR_EXPRESSION for them
// (tests/CMakeLists.txt) matches it, and a test whose output holds it counts as skipped whatever its
// exit status. The Python tests' skips use it too (tests/python/conftest.py); nothing else may print
// it (tests/scripts/test_skip_marker.sh).
#define CARACAL_SKIP_MARKER "CARACAL_SKIPPED: "

namespace caracal::test {

struct GpuRequirements {
  bool gpu = false;   // CARACAL_REQUIRE_GPU=1
  int gpus = 0;       // CARACAL_REQUIRE_GPUS (INT_MAX for larger values)
  std::string error;  // non-empty when a value is refused: names the variable, the value and what is accepted
};

// `require_gpu` and `require_gpus` are the variables' values, nullptr where unset.
inline GpuRequirements parse_gpu_requirements(const char* require_gpu, const char* require_gpus) {
  GpuRequirements r;
  const std::string gpu = require_gpu != nullptr ? require_gpu : "";
  if (gpu == "1") {
    r.gpu = true;
  } else if (!gpu.empty() && gpu != "0") {
    r.error = "CARACAL_REQUIRE_GPU=\"" + gpu + "\" is not accepted: it must be unset, empty, \"0\" or \"1\"";
  }
  const std::string gpus = require_gpus != nullptr ? require_gpus : "";
  bool digits = true;
  long long count = 0;
  for (const char c : gpus) {
    if (c < '0' || c > '9') {
      digits = false;
      break;
    }
    count = count * 10 + (c - '0');
    if (count > INT_MAX) count = INT_MAX;
  }
  if (digits) {
    r.gpus = static_cast<int>(count);
  } else {
    if (!r.error.empty()) r.error += "; ";
    r.error += "CARACAL_REQUIRE_GPUS=\"" + gpus +
               "\" is not accepted: it must be unset, empty or a non-negative decimal integer (the GPUs this "
               "machine has)";
  }
  return r;
}

inline GpuRequirements gpu_requirements() {
  return parse_gpu_requirements(std::getenv("CARACAL_REQUIRE_GPU"), std::getenv("CARACAL_REQUIRE_GPUS"));
}

}  // namespace caracal::test
