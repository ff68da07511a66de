// The FP8 up/gate with x gathered from the tokens' rows (Fp8UpGateSwigluArgs::x_tokens):
// Fp8UpGateSwigluGatheredGemm, one CTA a 128 x 256 tile (the only kernel instantiated in this unit).
#include "caracal/gemm/grouped_gemm_fp8.hpp"
#include "device/gemm/expert_gemms/up_gate_swiglu_fp8_gathered.cuh"
#include "device/gemm/grouped_gemm_kernel.cuh"
#include "gemm/fp8_descriptors.hpp"
#include "gemm/launch.cuh"
#include "gemm/up_gate_swiglu_fp8_launch.cuh"

namespace caracal::gemm {
namespace {

using Policy = Fp8UpGateSwigluGatheredGemm::Policy;
using Fp8UpGateSwigluGatheredKernel = Scheduled<Fp8UpGateSwigluGatheredGemm, RowTileSchedulerOf<Policy::kBlockN>>;

}  // namespace

void launch_up_gate_swiglu_fp8_gathered(const Fp8UpGateSwigluArgs& args, cudaStream_t stream) {
  using Gemm = Fp8UpGateSwigluGatheredKernel;
  const uint64_t d = uint64_t(args.hidden), i = uint64_t(args.intermediate);
  GemmParams<Gemm> p = fp8_row_gemm_params<Gemm>(args.rows, {}, args.w_gate_up, 2 * i, d, "x", "w_gate_up", args.tile_queue);
  p.mainloop.a_rows = {reinterpret_cast<const uint8_t*>(args.x_tokens.codes), args.x_tokens.scales, args.rows.rows,
                       int64_t(args.hidden), args.x_tokens.scale_block_stride, args.top_k};
  p.epilogue = up_gate_fp8_epilogue(args);
  launch_grouped_gemm<Gemm>(p, args.num_ctas, stream, "grouped_up_gate_swiglu (fp8)");
}

}  // namespace caracal::gemm
