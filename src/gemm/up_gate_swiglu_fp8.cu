// Forward up/gate + SwiGLU in FP8: Fp8UpGateSwigluGemm (device/gemm/expert_gemms/up_gate_swiglu_fp8.cuh),
// one CTA a 128 x 128 tile (the only kernel instantiated in this unit).
#include "caracal/gemm/grouped_gemm_fp8.hpp"
#include "device/gemm/block_scaled_mainloop.cuh"
#include "device/gemm/expert_gemms/up_gate_swiglu_fp8.cuh"
#include "device/gemm/grouped_gemm_kernel.cuh"
#include "device/gemm/row_tile_scheduler.cuh"
#include "gemm/host_checks.hpp"
#include "gemm/launch.cuh"
#include "gemm/operand_maps.hpp"
#include "gemm/tensor_map.hpp"

namespace caracal::gemm {
namespace {

using Policy = Fp8UpGateSwigluGemm::Policy;
using Fp8UpGateSwigluKernel = Scheduled<Fp8UpGateSwigluGemm, RowTileSchedulerOf<Policy::kBlockN>>;

}  // namespace

void grouped_up_gate_swiglu(const Fp8UpGateSwigluArgs& args, cudaStream_t stream) {
  using Gemm = Fp8UpGateSwigluKernel;
  using MapsA = OperandMaps<Gemm::OperandA>;
  using MapsB = OperandMaps<Gemm::OperandB>;
  check_up_gate_swiglu_args(args);
  if (args.rows.row_capacity == 0) return;

  const uint64_t rows = uint64_t(args.rows.buffer_rows());
  const uint64_t d = uint64_t(args.hidden), i = uint64_t(args.intermediate);
  const uint64_t experts = uint64_t(args.rows.num_experts);
  GemmParams<Gemm> p{};
  p.mainloop.a = MapsA::make_map<Policy::A>(args.x.codes, rows, d, "x.codes");
  p.mainloop.b = MapsB::make_map<Policy::B>(args.w_gate_up.codes, experts, 2 * i, d, "w_gate_up.codes");
  p.mainloop.scales_a = MapsA::make_scale_map<Policy::A>(args.x.scales, rows, d, "x.scales");
  p.mainloop.scales_b =
      MapsB::make_scale_map<Policy::B>(args.w_gate_up.scales, experts, 2 * i, d, "w_gate_up.scales");
  p.scheduler = {args.rows, int((2 * i + Policy::kBlockN - 1) / Policy::kBlockN), args.hidden / Policy::kBlockK,
                 args.tile_queue};
  p.epilogue.activation = make_tensor_map_2d(args.activation_out, rows, i, kChunkRows, kChunkCols, "activation_out");
  p.epilogue.store_gate_up = args.gate_up_out != nullptr;
  if (p.epilogue.store_gate_up) {
    p.epilogue.gate_up = make_tensor_map_2d(args.gate_up_out, rows, 2 * i, kChunkRows, kChunkCols, "gate_up_out");
  }
  p.epilogue.intermediate = args.intermediate;
  launch_grouped_gemm<Gemm>(p, args.num_ctas, stream, "grouped_up_gate_swiglu (fp8)");
}

}  // namespace caracal::gemm
