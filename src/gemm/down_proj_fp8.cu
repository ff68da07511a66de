// Forward down projection in FP8: Fp8DownProjGemm (device/gemm/expert_gemms/down_proj_fp8.cuh), one
// CTA a 128 x 128 tile (the only kernel instantiated in this unit).
#include "caracal/gemm/grouped_gemm_fp8.hpp"
#include "device/gemm/block_scaled_mainloop.cuh"
#include "device/gemm/expert_gemms/down_proj_fp8.cuh"
#include "device/gemm/grouped_gemm_kernel.cuh"
#include "device/gemm/row_tile_scheduler.cuh"
#include "gemm/host_checks.hpp"
#include "gemm/launch.cuh"
#include "gemm/operand_maps.hpp"
#include "gemm/tensor_map.hpp"

namespace caracal::gemm {
namespace {

using Policy = Fp8DownProjGemm::Policy;
using Fp8DownProjKernel = Scheduled<Fp8DownProjGemm, RowTileSchedulerOf<Policy::kBlockN>>;

}  // namespace

void grouped_down_proj(const Fp8DownProjArgs& args, cudaStream_t stream) {
  using Gemm = Fp8DownProjKernel;
  using MapsA = OperandMaps<Gemm::OperandA>;
  using MapsB = OperandMaps<Gemm::OperandB>;
  check_down_proj_args(args);
  if (args.rows.row_capacity == 0) return;

  const uint64_t rows = uint64_t(args.rows.buffer_rows());
  const uint64_t d = uint64_t(args.hidden), i = uint64_t(args.intermediate);
  const uint64_t experts = uint64_t(args.rows.num_experts);
  GemmParams<Gemm> p{};
  p.mainloop.a = MapsA::make_map<Policy::A>(args.activation.codes, rows, i, "activation.codes");
  p.mainloop.b = MapsB::make_map<Policy::B>(args.w_down.codes, experts, d, i, "w_down.codes");
  p.mainloop.scales_a = MapsA::make_scale_map<Policy::A>(args.activation.scales, rows, i, "activation.scales");
  p.mainloop.scales_b = MapsB::make_scale_map<Policy::B>(args.w_down.scales, experts, d, i, "w_down.scales");
  p.scheduler = {args.rows, int((d + Policy::kBlockN - 1) / Policy::kBlockN), args.intermediate / Policy::kBlockK,
                 args.tile_queue};
  p.epilogue.out = make_tensor_map_2d(args.y_out, rows, d, kChunkRows, kChunkCols, "y_out");
  p.epilogue.cols = args.hidden;
  launch_grouped_gemm<Gemm>(p, args.num_ctas, stream, "grouped_down_proj (fp8)");
}

}  // namespace caracal::gemm
