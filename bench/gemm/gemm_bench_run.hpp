#pragma once
// One caracal_gemm_bench case on the GPU: random inputs (rotated between copies when one set would
// sit in L2), one forward and one backward spot-checked against fp64 (gemm_spot_checks.hpp), then
// each of our kernels and its cuBLAS dense counterpart timed (the median of `reps` CUDA-event-
// bracketed runs after `warmup`, event_timer.hpp, spread over rounds in which every kernel runs
// in turn); and CUTLASS's own grouped GEMMs on the
// forward's and the backward's GEMMs (gemm_bench_cutlass.hpp), their outputs first compared with
// ours; where D and I are multiples of 128, our FP8 GEMMs and CUTLASS's blockwise FP8 grouped GEMMs
// (forward, weight gradients) on the same inputs quantized (gemm_bench_fp8.hpp).
#include <cublas_v2.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "gemm_bench_support.hpp"

namespace caracal::bench {

struct Timing {
  double ms = 0.0;             // median
  double min_ms = 0.0, max_ms = 0.0;
  double tflops = 0.0;         // useful FLOPs (real rows) per second, at the median
  double tflops_padded = 0.0;  // FLOPs the kernels execute (padded rows)
};

struct CaseResult {
  std::map<std::string, Timing> timings;  // by kernel: ours, and cublas_* / cutlass_* where the case has rows
  double check_rel_err = 0.0;             // forward spot check
  double check_rel_err_backward = 0.0;    // backward spot check (worst of its parts)
  // CUTLASS's outputs against ours (every schedule, the worst), relative Frobenius: -1 = not run.
  double cutlass_up_rel_diff = -1.0;
  double cutlass_down_rel_diff = -1.0;
  double cutlass_dx_rel_diff = -1.0;
  double cutlass_wgrad_rel_diff = -1.0;  // fp32 weight gradients
  // CUTLASS's blockwise FP8 outputs against our FP8 GEMMs' (gemm_bench_fp8.hpp): -1 = not run.
  double cutlass_fp8_up_rel_diff = -1.0;
  double cutlass_fp8_down_rel_diff = -1.0;
  double cutlass_fp8_wgrad_rel_diff = -1.0;
  uint64_t fp8_output_digest = 0;  // Fp8Gemms::output_digest after the first run of each; 0 = not run
};

// `l2_bytes`: the GPU's L2, which sets how many input sets rotate; `with_fp8`: also the FP8 GEMMs
// and CUTLASS's blockwise FP8 (where the case's shape supports them).
CaseResult run_case(const Case& c, cublasHandle_t cublas, int warmup, int reps, uint64_t seed, size_t l2_bytes,
                    bool with_fp8);

}  // namespace caracal::bench
