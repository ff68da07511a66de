#pragma once
// What every grouped GEMM of an expert pass (ExpertPass, Fp8ExpertPass) shares: its rows, shape and
// CTA count. Host only.

namespace caracal::gemm {

// `Args` with `pass`'s rows, shape and CTA count; each GEMM's operands are set after.
template <typename Args, typename Pass>
Args pass_args(const Pass& pass) {
  Args a;
  a.rows = pass.rows;
  a.hidden = pass.hidden;
  a.intermediate = pass.intermediate;
  a.num_ctas = pass.num_ctas;
  return a;
}

}  // namespace caracal::gemm
