#pragma once
// The backward's row-tile GEMMs' descriptors from their arguments: the dgrad+SwiGLU GEMM's for its
// standalone launcher (src/gemm/down_dgrad_swiglu.cu) and the fused backward
// (src/fused/backward.cu); the dx GEMM's for its standalone launcher
// (src/gemm/gate_up_dgrad.cu), the one that stores the rows home
// (src/gemm/gate_up_dgrad_to_home.cu) and the fused backward.
#include <cstdint>

#include "caracal/gemm/grouped_gemm_backward.hpp"
#include "device/gemm/expert_gemms/down_dgrad_swiglu.cuh"
#include "device/gemm/expert_gemms/gate_up_dgrad.cuh"
#include "gemm/row_gemm_operands.hpp"
#include "gemm/tensor_map.hpp"

namespace caracal::gemm {

// The SwiGLU backward + router-score epilogue's parameters (bf16 outputs), over `rows` with
// n_blocks N tiles of I a row; the FP8 dgrad's epilogue holds them too.
inline SwigluBackwardEpilogue::Params swiglu_backward_params(const ScheduleView& rows, int intermediate,
                                                             const __nv_bfloat16* gate_up, const float* gates,
                                                             __nv_bfloat16* d_gate_up_out,
                                                             __nv_bfloat16* scaled_activation_out, float* workspace,
                                                             int n_blocks) {
  const uint64_t buffer_rows = uint64_t(rows.buffer_rows());
  const uint64_t i = uint64_t(intermediate);
  SwigluBackwardEpilogue::Params e{};
  e.d_gate_up = make_tensor_map_2d(d_gate_up_out, buffer_rows, 2 * i, kChunkRows, kChunkCols, "d_gate_up_out");
  e.scaled_activation =
      make_tensor_map_2d(scaled_activation_out, buffer_rows, i, kChunkRows, kChunkCols, "scaled_activation_out");
  e.gate_up_source = make_tensor_map_2d(gate_up, buffer_rows, 2 * i, kBlockM, kChunkCols, "gate_up");
  e.gate_up = gate_up;
  e.row_gates = gates;
  e.dg_partials = workspace;
  e.intermediate = intermediate;
  e.n_blocks = n_blocks;
  return e;
}

// d_h = dy · W_down[e]: dy [rows][D] K-major; W_down [L][D][I] read as it is stored, K = D rows of
// N = I contiguous columns (MN-major); the SwiGLU backward + router-score epilogue.
using DownDgradSwigluDescriptors = RowGemmDescriptors<SwigluBackwardEpilogue>;

inline DownDgradSwigluDescriptors down_dgrad_swiglu_descriptors(const DownDgradSwigluArgs& args) {
  const uint64_t d = uint64_t(args.hidden);
  const uint64_t i = uint64_t(args.intermediate);
  const RowGemmOperands o = row_gemm_operands<DownDgradSwigluGemm>(
      args.rows, args.tile_queue, uint64_t(args.rows.buffer_rows()), args.dy, "dy", args.w_down, "w_down", i, d);
  return {o, swiglu_backward_params(args.rows, args.intermediate, args.gate_up, args.gates, args.d_gate_up_out,
                                    args.scaled_activation_out, args.workspace, o.tiles.n_blocks)};
}

// dx = d_gate_up · W_gate_up[e]: d_gate_up [rows][2I] K-major; W_gate_up [L][2I][D] in either row
// order through its gate/up view, K = 2I rows of N = D contiguous columns (MN-major).
using GateUpDgradDescriptors = RowGemmOperands;

inline GateUpDgradDescriptors gate_up_dgrad_descriptors(const GateUpDgradArgs& args) {
  const uint64_t d = uint64_t(args.hidden);
  const uint64_t i = uint64_t(args.intermediate);
  // GateUpDgradToHomeGemm's operands too.
  RowGemmOperands o = row_gemm_operands<GateUpDgradGemm>(args.rows, args.tile_queue, uint64_t(args.rows.buffer_rows()),
                                                         args.d_gate_up, "d_gate_up", args.w_gate_up, "w_gate_up", d,
                                                         2 * i);
  o.mainloop.b = OperandMaps<GateUpDgradGemm::OperandB>::make_map<GateUpDgradGemm::Policy::B>(
      args.w_gate_up, uint64_t(args.rows.num_experts), 2 * i, d, "w_gate_up", args.w_gate_up_layout);
  return o;
}

}  // namespace caracal::gemm
