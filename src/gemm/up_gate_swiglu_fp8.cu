// Forward up/gate + SwiGLU in FP8: Fp8UpGateSwigluGemm (device/gemm/expert_gemms/up_gate_swiglu_fp8.cuh),
// one CTA a 128 x 256 tile (the only kernel instantiated in this unit).
#include "caracal/gemm/grouped_gemm_fp8.hpp"
#include "device/gemm/expert_gemms/up_gate_swiglu_fp8.cuh"
#include "device/gemm/grouped_gemm_kernel.cuh"
#include "gemm/fp8_descriptors.hpp"
#include "gemm/host_checks.hpp"
#include "gemm/launch.cuh"
#include "gemm/tensor_map.hpp"

namespace caracal::gemm {
namespace {

using Policy = Fp8UpGateSwigluGemm::Policy;
using Fp8UpGateSwigluKernel = Scheduled<Fp8UpGateSwigluGemm, RowTileSchedulerOf<Policy::kBlockN>>;

}  // namespace

void grouped_up_gate_swiglu(const Fp8UpGateSwigluArgs& args, cudaStream_t stream) {
  using Gemm = Fp8UpGateSwigluKernel;
  check_up_gate_swiglu_args(args);
  if (args.rows.row_capacity == 0) return;

  const uint64_t rows = uint64_t(args.rows.buffer_rows());
  const uint64_t d = uint64_t(args.hidden), i = uint64_t(args.intermediate);
  GemmParams<Gemm> p =
      fp8_row_gemm_params<Gemm>(args.rows, args.x, args.w_gate_up, 2 * i, d, "x", "w_gate_up", args.tile_queue);
  UpGateSwigluFp8Epilogue::Params& e = p.epilogue;
  e.swiglu.intermediate = args.intermediate;
  e.swiglu.store_gate_up = args.gate_up_out != nullptr;
  if (e.swiglu.store_gate_up) {
    e.swiglu.gate_up = make_tensor_map_2d(args.gate_up_out, rows, 2 * i, kChunkRows, kChunkCols, "gate_up_out");
  }
  e.store_activation = args.activation_out != nullptr;
  if (e.store_activation) {
    e.swiglu.activation = make_tensor_map_2d(args.activation_out, rows, i, kChunkRows, kChunkCols, "activation_out");
  }
  e.store_activation_codes = args.activation_fp8_out.codes != nullptr;
  if (e.store_activation_codes) {
    e.activation_codes = make_tensor_map_2d(args.activation_fp8_out.codes, rows, i, kChunkRows, kScaleBlock,
                                            "activation_fp8_out.codes", TensorElement::kE4m3);
    e.activation_scales = args.activation_fp8_out.scales;
  }
  e.buffer_rows = int(rows);
  launch_grouped_gemm<Gemm>(p, args.num_ctas, stream, "grouped_up_gate_swiglu (fp8)");
}

}  // namespace caracal::gemm
