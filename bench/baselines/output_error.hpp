#pragma once
// An output against its fp64 reference, tightly, for the GPU tests and `caracal bench`'s
// validation alike: each output has its own bound and is checked both as a whole (relative
// Frobenius error) and row by row (a token's y or dx, one expert's weight gradient), so that a
// small systematic error in one place (one expert off by 0.5%, one token dropped) cannot hide in
// the average. Every element must have been written (outputs are poisoned with NaN first), and a
// row whose reference is exactly 0 must be exactly 0. Host only; prints nothing.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace caracal::checks {

// The largest errors an output may show: relative Frobenius over the whole output, and relative
// error of any one row.
struct ErrorBound {
  double frobenius = 0.0;
  double row = 0.0;
};

// Accumulates one output row by row.
class OutputError {
 public:
  explicit OutputError(std::string name) : name_(std::move(name)) {}

  // Adds one element of the current row; a NaN counts as unwritten.
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

  const std::string& name() const { return name_; }
  double frobenius() const { return ref2_ == 0.0 ? (err2_ == 0.0 ? 0.0 : INFINITY) : std::sqrt(err2_ / ref2_); }
  double worst_row() const { return worst_row_; }
  size_t unwritten() const { return nan_; }            // NaN elements
  size_t nonzero_rows() const { return nonzero_; }     // rows that should be exactly 0 and are not

  // What is wrong against `bound`, as one message naming the output (empty: nothing).
  std::vector<std::string> failures(const ErrorBound& bound) const {
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
    if (m.tellp() > 0) return {m.str()};
    return {};
  }

 private:
  std::string name_;
  double err2_ = 0.0, ref2_ = 0.0, row_err2_ = 0.0, row_ref2_ = 0.0, worst_row_ = 0.0;
  size_t nan_ = 0, nonzero_ = 0;
};

// `got(i)` against want[i] for `rows` rows of `cols` elements, into `e`.
template <typename Got>
void add_rows(OutputError& e, Got got, const std::vector<double>& want, size_t rows, size_t cols) {
  for (size_t r = 0; r < rows; ++r) {
    for (size_t c = 0; c < cols; ++c) e.add(got(r * cols + c), want[r * cols + c]);
    e.end_row();
  }
}

inline void append(std::vector<std::string>& to, const std::vector<std::string>& more) {
  to.insert(to.end(), more.begin(), more.end());
}

}  // namespace caracal::checks
