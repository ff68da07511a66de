#pragma once
// Turns a failed NCCL call into caracal::Error naming the call, NCCL's error string and its last
// error message (which usually says what was wrong).
#include <string>

#include <nccl.h>

#include "caracal/error.hpp"

namespace caracal::comm {

inline void check_nccl(ncclResult_t result, const char* what, ncclComm_t comm = nullptr) {
  if (result == ncclSuccess) return;
  const char* last = ncclGetLastError(comm);
  const std::string detail = last != nullptr && last[0] != '\0' ? caracal::detail::concat(" (", last, ")") : "";
  throw Error(caracal::detail::concat(what, " failed: ", ncclGetErrorString(result), detail));
}

}  // namespace caracal::comm
