// Backward step 1 in FP8 where K is long: Fp8DownDgradSwigluWideGemm
// (device/gemm/expert_gemms/down_dgrad_swiglu_fp8.cuh), one CTA a 128 x 256 tile (the only
// grouped-GEMM instantiation in this unit), then the router-score partials' reduction.
#include "device/gemm/expert_gemms/down_dgrad_swiglu_fp8.cuh"
#include "gemm/down_dgrad_swiglu_fp8_launch.cuh"

namespace caracal::gemm {

void launch_fp8_down_dgrad_swiglu_wide(const Fp8DownDgradSwigluArgs& args, cudaStream_t stream, const char* fn) {
  launch_fp8_down_dgrad_swiglu<Fp8DownDgradSwigluWideGemm>(args, stream, fn);
}

}  // namespace caracal::gemm
