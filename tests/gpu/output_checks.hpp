#pragma once
// The tests' side of bench/baselines/output_error.hpp (outputs against the fp64 reference, per output and
// per row; the bounds themselves come from there and from bench/baselines/layer_bounds.hpp): the same checks,
// each printing the error it measured ("  error <name>: ...", with the running test's name),
// which is where the bounds come from (scripts/lib/error_summary.py collects them).
//
// The checks return what failed instead of asserting, so a test can also show that a
// deliberately wrong result fails them (tests named ...CatchDeliberateErrors).
#include <gtest/gtest.h>

#include <cstddef>
#include <iostream>
#include <string>
#include <vector>

#include "output_error.hpp"  // bench/

namespace caracal::test {

using checks::append;
using checks::ErrorBound;

// "Suite.Test/param" of the running test ("" outside one).
inline std::string current_test() {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return info == nullptr ? "" : std::string(info->test_suite_name()) + "." + info->name();
}

// checks::OutputError whose failures() also prints the measured error.
class OutputError : public checks::OutputError {
 public:
  using checks::OutputError::OutputError;

  // What is wrong against `bound` (empty: nothing). Prints the measured error unless `report` is
  // off (comparisons against deliberately wrong results).
  std::vector<std::string> failures(const ErrorBound& bound, bool report = true) const {
    if (report) {
      std::cout << "  error " << name() << ": frobenius " << frobenius() << ", worst row " << worst_row() << " ["
                << current_test() << "]\n";
    }
    return checks::OutputError::failures(bound);
  }
};

// `got(i)` against want[i] for `rows` rows of `cols` elements.
template <typename Got>
std::vector<std::string> compare_rows(const std::string& name, Got got, const std::vector<double>& want, size_t rows,
                                      size_t cols, const ErrorBound& bound, bool report = true) {
  OutputError e(name);
  checks::add_rows(e, got, want, rows, cols);
  return e.failures(bound, report);
}

}  // namespace caracal::test
