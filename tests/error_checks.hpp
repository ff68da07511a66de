#pragma once
// The check of a refused call, shared by the unit and the GPU tests: it throws caracal::Error,
// and the message names what is wrong.
#include <gtest/gtest.h>

#include <initializer_list>
#include <string>

#include "caracal/error.hpp"

namespace caracal::test {

// `call` throws caracal::Error whose message holds every one of `parts`.
template <typename Call>
void expect_error(Call call, std::initializer_list<const char*> parts) {
  try {
    call();
    ADD_FAILURE() << "no caracal::Error thrown";
  } catch (const Error& e) {
    const std::string message = e.what();
    for (const char* part : parts) EXPECT_NE(message.find(part), std::string::npos) << message;
  }
}

}  // namespace caracal::test
