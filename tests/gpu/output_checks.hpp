#pragma once
// Comparing a GPU output with its fp64 reference, tightly: each output has its own bound, about 3x
// the largest error measured on the GPU for it, and is checked both as a whole (relative Frobenius
// error) and row by row (a token's y or dx, one expert's weight gradient), so that a small
// systematic error in one place (one expert off by 0.5%, one token dropped) cannot hide in the
// average. Every element must have been written (outputs are poisoned with NaN first), and a row
// whose reference is exactly 0 must be exactly 0.
//
// The checks return what failed instead of asserting, so a test can also show that a
// deliberately wrong result fails them (tests named ...CatchDeliberateErrors). Every check prints
// the error it measured ("  error <name>: ..."), which is where the bounds come from.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace caracal::test {

// The largest errors an output may show: relative Frobenius over the whole output, and relative
// error of any one row.
struct ErrorBound {
  double frobenius = 0.0;
  double row = 0.0;
};

// "Suite.Test/param" of the running test ("" outside one).
inline std::string current_test() {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return info == nullptr ? "" : std::string(info->test_suite_name()) + "." + info->name();
}

// Accumulates one output row by row.
class OutputError {
 public:
  explicit OutputError(std::string name) : name_(std::move(name)) {}

  // Adds one element of the current row.
  void add(double got, double want) {
    if (std::isnan(got)) {
      ++nan_;
      return;
    }
    const double diff = got - want;
    row_err2_ += diff * diff;
    row_ref2_ += want * want;
  }
  // Closes the current row.
  void end_row() {
    if (row_ref2_ == 0.0) {
      if (row_err2_ != 0.0) ++nonzero_;  // the reference row is exactly 0, the output is not
    } else {
      worst_row_ = std::max(worst_row_, std::sqrt(row_err2_ / row_ref2_));
    }
    err2_ += row_err2_;
    ref2_ += row_ref2_;
    row_err2_ = row_ref2_ = 0.0;
  }

  double frobenius() const { return ref2_ == 0.0 ? (err2_ == 0.0 ? 0.0 : INFINITY) : std::sqrt(err2_ / ref2_); }
  double worst_row() const { return worst_row_; }

  // What is wrong against `bound` (empty: nothing). Prints the measured error (with the running
  // test's name) unless `report` is off (comparisons against deliberately wrong results).
  std::vector<std::string> failures(const ErrorBound& bound, bool report = true) const {
    if (report) {
      std::cout << "  error " << name_ << ": frobenius " << frobenius() << ", worst row " << worst_row_ << " ["
                << current_test() << "]\n";
    }
    std::vector<std::string> out;
    std::ostringstream m;
    if (nan_ != 0) m << name_ << ": " << nan_ << " elements not written (NaN)";
    if (nonzero_ != 0) m << (m.tellp() > 0 ? "; " : "") << name_ << ": " << nonzero_ << " rows should be exactly 0";
    if (!(frobenius() <= bound.frobenius)) {
      m << (m.tellp() > 0 ? "; " : "") << name_ << ": relative Frobenius error " << frobenius() << " > "
        << bound.frobenius;
    }
    if (!(worst_row_ <= bound.row)) {
      m << (m.tellp() > 0 ? "; " : "") << name_ << ": worst row's relative error " << worst_row_ << " > " << bound.row;
    }
    if (m.tellp() > 0) out.push_back(m.str());
    return out;
  }

 private:
  std::string name_;
  double err2_ = 0.0, ref2_ = 0.0, row_err2_ = 0.0, row_ref2_ = 0.0, worst_row_ = 0.0;
  size_t nan_ = 0, nonzero_ = 0;
};

// `got(i)` against want[i] for `rows` rows of `cols` elements.
template <typename Got>
std::vector<std::string> compare_rows(const std::string& name, Got got, const std::vector<double>& want, size_t rows,
                                      size_t cols, const ErrorBound& bound, bool report = true) {
  OutputError e(name);
  for (size_t r = 0; r < rows; ++r) {
    for (size_t c = 0; c < cols; ++c) e.add(got(r * cols + c), want[r * cols + c]);
    e.end_row();
  }
  return e.failures(bound, report);
}

inline void append(std::vector<std::string>& to, const std::vector<std::string>& more) {
  to.insert(to.end(), more.begin(), more.end());
}

}  // namespace caracal::test
