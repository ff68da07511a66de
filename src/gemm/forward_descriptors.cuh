#pragma once
// The forward GEMMs' descriptors (TMA maps, tiles, epilogue parameters) from their arguments, for
// the standalone launchers (src/gemm/*.cu) and the fused forward (src/fused), whose
// row buffers may be a ring: every row buffer's map spans `buffer_rows` rows.
#include <cstdint>

#include "caracal/gemm/grouped_gemm.hpp"
#include "device/gemm/expert_gemms/down_proj.cuh"
#include "device/gemm/expert_gemms/up_gate_swiglu.cuh"
#include "gemm/epilogue_params.hpp"
#include "gemm/row_gemm_operands.hpp"

namespace caracal::gemm {

// gate_up = x · W_gate_up[e]^T with the SwiGLU epilogue: x [rows][D] and W_gate_up [L][2I][D], both
// K-major.
using UpGateSwigluDescriptors = RowGemmDescriptors<UpGateSwigluEpilogue>;

inline UpGateSwigluDescriptors up_gate_swiglu_descriptors(const UpGateSwigluArgs& args, uint64_t buffer_rows) {
  const uint64_t d = uint64_t(args.hidden);
  const uint64_t i = uint64_t(args.intermediate);
  RowGemmOperands o = row_gemm_operands<UpGateSwigluGemm>(args.rows, args.tile_queue, buffer_rows, args.x, "x",
                                                          args.w_gate_up, "w_gate_up", 2 * i, d);
  o.mainloop.b = OperandMaps<UpGateSwigluGemm::OperandB>::make_map<UpGateSwigluGemm::Policy::B>(
      args.w_gate_up, uint64_t(args.rows.num_experts), 2 * i, d, "w_gate_up", args.w_gate_up_layout);
  return {o, swiglu_epilogue_params(args.activation_out, args.gate_up_out, buffer_rows, args.intermediate)};
}

// y = activation · W_down[e]^T: activation [rows][I] and W_down [L][D][I], both K-major; y [rows][D]
// (y_out null: no output map, for a caller that stores the rows elsewhere).
using DownProjDescriptors = RowGemmDescriptors<RowsBf16Epilogue>;

inline DownProjDescriptors down_proj_descriptors(const DownProjArgs& args, uint64_t buffer_rows) {
  const uint64_t d = uint64_t(args.hidden);
  const uint64_t i = uint64_t(args.intermediate);
  const RowGemmOperands o = row_gemm_operands<DownProjGemm>(args.rows, args.tile_queue, buffer_rows, args.activation,
                                                            "activation", args.w_down, "w_down", d, i);
  return {o, rows_epilogue_params(args.y_out, buffer_rows, args.hidden, "y_out")};
}

}  // namespace caracal::gemm
