#pragma once
// Caracal reports every failure as caracal::Error: bad arguments (naming the argument and the
// value expected), CUDA/NCCL failures, and device-side errors raised at the next check.
#include <sstream>
#include <stdexcept>
#include <string>

namespace caracal {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
template <typename... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}
}  // namespace detail

// Throws caracal::Error with the streamed message unless `cond` holds.
#define CARACAL_CHECK(cond, ...)                                            \
  do {                                                                      \
    if (!(cond)) throw ::caracal::Error(::caracal::detail::concat(__VA_ARGS__)); \
  } while (0)

}  // namespace caracal
