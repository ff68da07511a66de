#pragma once
// Where a test finds a program of the build it runs end to end.
#include <unistd.h>

#include <cstdlib>
#include <string>

namespace caracal::test {

// $`env_var` when set; else `name` in the root of this test's build tree (<build>/tests/..), which
// still works when the build tree moved (the device machine); else `compiled_in` (CMake's path).
inline std::string tool_path(const char* env_var, const char* name, const char* compiled_in) {
  const char* env = std::getenv(env_var);
  if (env && *env) return env;
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
