#pragma once
// The quantize launchers' pointer checks (host): every operand non-null, then every operand
// aligned, in the order given; the first failure throws caracal::Error "<where>: <name> must not
// be null" or "<where>: <name> must be <alignment>-byte aligned".
#include <cstdint>
#include <initializer_list>

#include "caracal/error.hpp"

namespace caracal::quant {

struct Operand {
  const void* pointer;
  const char* name;
  uintptr_t alignment;  // bytes; 1: any address
};

inline void check_operands(const char* where, std::initializer_list<Operand> operands) {
  for (const Operand& o : operands) CARACAL_CHECK(o.pointer != nullptr, where, ": ", o.name, " must not be null");
  for (const Operand& o : operands) {
    CARACAL_CHECK(reinterpret_cast<uintptr_t>(o.pointer) % o.alignment == 0, where, ": ", o.name, " must be ",
                  o.alignment, "-byte aligned");
  }
}

}  // namespace caracal::quant
