#pragma once
// Where a tool the smoke tests run lives: $`env` when set; else `name` in this test's build tree
// (<build>/tests/.., which still works when the build tree moved, as on the device machine); else
// `compiled_in`, the path CMake compiled in.
#include <unistd.h>

#include <cstdlib>
#include <string>

namespace caracal::test {

inline std::string tool_path(const char* env, const char* name, const char* compiled_in) {
  const char* value = std::getenv(env);
  if (value && *value) return value;
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n > 0) {
    self[n] = '\0';
    std::string dir(self);
    dir = dir.substr(0, dir.rfind('/'));  // <build>/tests
    const std::string candidate = dir.substr(0, dir.rfind('/')) + "/" + name;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return compiled_in;
}

}  // namespace caracal::test
