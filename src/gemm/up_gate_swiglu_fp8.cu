// Forward up/gate + SwiGLU in FP8: Fp8UpGateSwigluGemm (device/gemm/expert_gemms/up_gate_swiglu_fp8.cuh),
// one CTA a 128 x 256 tile (the only kernel instantiated in this unit); x_tokens' launch is
// up_gate_swiglu_fp8_gathered.cu's.
#include "caracal/gemm/grouped_gemm_fp8.hpp"
#include "device/gemm/expert_gemms/up_gate_swiglu_fp8.cuh"
#include "device/gemm/grouped_gemm_kernel.cuh"
#include "gemm/fp8_descriptors.hpp"
#include "gemm/host_checks.hpp"
#include "gemm/launch.cuh"
#include "gemm/tensor_map.hpp"
#include "gemm/up_gate_swiglu_fp8_launch.cuh"

namespace caracal::gemm {
namespace {

using Policy = Fp8UpGateSwigluGemm::Policy;
using Fp8UpGateSwigluKernel = Scheduled<Fp8UpGateSwigluGemm, RowTileSchedulerOf<Policy::kBlockN>>;

}  // namespace

void grouped_up_gate_swiglu(const Fp8UpGateSwigluArgs& args, cudaStream_t stream) {
  using Gemm = Fp8UpGateSwigluKernel;
  check_up_gate_swiglu_args(args);
  if (args.rows.row_capacity == 0) return;
  if (args.x_tokens.codes != nullptr) {
    launch_up_gate_swiglu_fp8_gathered(args, stream);
    return;
  }
  const uint64_t d = uint64_t(args.hidden), i = uint64_t(args.intermediate);
  GemmParams<Gemm> p =
      fp8_row_gemm_params<Gemm>(args.rows, args.x, args.w_gate_up, 2 * i, d, "x", "w_gate_up", args.tile_queue);
  p.epilogue = up_gate_fp8_epilogue(args);
  launch_grouped_gemm<Gemm>(p, args.num_ctas, stream, "grouped_up_gate_swiglu (fp8)");
}

}  // namespace caracal::gemm
