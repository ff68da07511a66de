// Backward step 1 in FP8: Fp8DownDgradSwigluGemm (device/gemm/expert_gemms/down_dgrad_swiglu_fp8.cuh),
// one CTA a 128 x 128 tile (the only grouped-GEMM instantiation in this unit), or where K is long
// the 128 x 256 tile's launch (down_dgrad_swiglu_fp8_wide.cu); then the fixed-order reduction of the
// router-score partials.
#include "caracal/gemm/grouped_gemm_backward_fp8.hpp"
#include "device/gemm/expert_gemms/down_dgrad_swiglu_fp8.cuh"
#include "gemm/down_dgrad_swiglu_fp8_launch.cuh"
#include "gemm/host_checks.hpp"

namespace caracal::gemm {

size_t fp8_down_dgrad_workspace_floats(int row_capacity, int intermediate) {
  // A partial per row and N tile of the narrower tile: enough for either.
  constexpr int kTileN = Fp8DownDgradSwigluGemm::Policy::kBlockN;
  if (row_capacity <= 0 || intermediate <= 0) return 0;
  return size_t(row_capacity) * size_t((intermediate + kTileN - 1) / kTileN);
}

void grouped_down_dgrad_swiglu(const Fp8DownDgradSwigluArgs& args, cudaStream_t stream) {
  const char* fn = "grouped_down_dgrad_swiglu (fp8)";
  check_down_dgrad_swiglu_args(args);
  if (args.rows.row_capacity == 0) return;
  if (fp8_dgrad_wide_tiles(args.hidden)) {
    launch_fp8_down_dgrad_swiglu_wide(args, stream, fn);
  } else {
    launch_fp8_down_dgrad_swiglu<Fp8DownDgradSwigluGemm>(args, stream, fn);
  }
}

}  // namespace caracal::gemm
