#pragma once
// A CUTLASS grouped GEMM set up for one problem (cutlass_grouped_gemm.hpp's bf16 configurations,
// cutlass_fp8_grouped_gemm.hpp's FP8 one), run as often as asked.
#include <cuda_runtime.h>

namespace caracal::bench {

class CutlassGroupedGemm {
 public:
  virtual ~CutlassGroupedGemm() = default;
  // Enqueues the whole grouped GEMM on `stream`; throws caracal::Error if CUTLASS refuses.
  virtual void run(cudaStream_t stream) = 0;
};

}  // namespace caracal::bench
