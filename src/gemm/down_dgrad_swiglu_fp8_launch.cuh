#pragma once
// The FP8 dgrad's launch in either tile (src/gemm/down_dgrad_swiglu_fp8.cu, _wide.cu: one
// instantiation each): the grouped GEMM, then the fixed-order reduction of the router-score partials
// (one per row and N tile); and its parameters, which the fused FP8 backward's tiles take too.
#include "caracal/gemm/grouped_gemm_backward_fp8.hpp"
#include "device/gemm/grouped_gemm_kernel.cuh"
#include "device/gemm/row_tile_scheduler.cuh"
#include "gemm/backward_descriptors.cuh"
#include "gemm/fp8_descriptors.hpp"
#include "gemm/launch.cuh"
#include "gemm/router_grad_reduce.hpp"
#include "gemm/tensor_map.hpp"

namespace caracal::gemm {

// The grouped GEMM's parameters over `args` (checked by the caller): `Gemm` a Scheduled FP8 dgrad
// (its tile queue args.tile_queue); the fused FP8 backward takes its mainloop, epilogue and tiles.
template <class Gemm>
GemmParams<Gemm> fp8_down_dgrad_swiglu_params(const Fp8DownDgradSwigluArgs& args) {
  const uint64_t rows = uint64_t(args.rows.buffer_rows());
  const uint64_t d = uint64_t(args.hidden), i = uint64_t(args.intermediate);
  GemmParams<Gemm> p = fp8_row_gemm_params<Gemm>(args.rows, args.dy, args.w_down_t, i, d, "dy", "w_down_t", args.tile_queue);
  p.epilogue.swiglu =
      swiglu_backward_params(args.rows, args.intermediate, args.gate_up, args.gates, args.d_gate_up_out,
                             args.scaled_activation_out, args.workspace, p.scheduler.n_blocks);
  p.epilogue.d_gate_up_codes = make_tensor_map_2d(args.d_gate_up_fp8_out.codes, rows, 2 * i, kChunkRows,
                                                  kScaleBlock, "d_gate_up_fp8_out.codes", TensorElement::kE4m3);
  p.epilogue.d_gate_up_scales = args.d_gate_up_fp8_out.scales;
  p.epilogue.buffer_rows = int(rows);
  return p;
}

// `args` checked by the caller.
template <class DgradGemm>
void launch_fp8_down_dgrad_swiglu(const Fp8DownDgradSwigluArgs& args, cudaStream_t stream, const char* fn) {
  using Gemm = Scheduled<DgradGemm, RowTileSchedulerOf<DgradGemm::Policy::kBlockN>>;
  const GemmParams<Gemm> p = fp8_down_dgrad_swiglu_params<Gemm>(args);
  launch_grouped_gemm<Gemm>(p, args.num_ctas, stream, fn);
  reduce_router_grad(args.workspace, p.scheduler.n_blocks, args.rows, args.d_gates_out, stream, fn);
}

// The wide tile's launch (src/gemm/down_dgrad_swiglu_fp8_wide.cu).
void launch_fp8_down_dgrad_swiglu_wide(const Fp8DownDgradSwigluArgs& args, cudaStream_t stream, const char* fn);

}  // namespace caracal::gemm
