#pragma once
// The forward GEMMs' descriptors (TMA maps, tiles, epilogue parameters) from their arguments, for
// the standalone launchers (src/gemm/*.cu) and the fused forward (src/fused), whose
// row buffers may be a ring: every row buffer's map spans `buffer_rows` rows.
#include <cstdint>

#include "caracal/gemm/grouped_gemm.hpp"
#include "device/gemm/expert_gemms/down_proj.cuh"
#include "device/gemm/expert_gemms/up_gate_swiglu.cuh"
#include "device/gemm/mainloop.cuh"
#include "device/gemm/row_tile_scheduler.cuh"
#include "gemm/operand_maps.hpp"
#include "gemm/tensor_map.hpp"

namespace caracal::gemm {

// gate_up = x · W_gate_up[e]^T with the SwiGLU epilogue: x [rows][D] and W_gate_up [L][2I][D], both
// K-major.
struct UpGateSwigluDescriptors {
  MainloopParams mainloop;
  RowTileScheduler::Params tiles;
  UpGateSwigluEpilogue::Params epilogue;
};

inline UpGateSwigluDescriptors up_gate_swiglu_descriptors(const UpGateSwigluArgs& args, uint64_t buffer_rows) {
  using Gemm = UpGateSwigluGemm;
  using Policy = Gemm::Policy;
  using MapsA = OperandMaps<Gemm::OperandA>;
  using MapsB = OperandMaps<Gemm::OperandB>;
  const uint64_t d = uint64_t(args.hidden);
  const uint64_t i = uint64_t(args.intermediate);
  UpGateSwigluDescriptors g{};
  g.mainloop.a = MapsA::make_map<Policy::A>(args.x, buffer_rows, d, "x");
  g.mainloop.b =
      MapsB::make_map<Policy::B>(args.w_gate_up, uint64_t(args.rows.num_experts), 2 * i, d, "w_gate_up");
  g.tiles = {args.rows, int((2 * i + Policy::kBlockN - 1) / Policy::kBlockN), args.hidden / Policy::kBlockK,
             args.tile_queue};
  g.epilogue.activation =
      make_tensor_map_2d(args.activation_out, buffer_rows, i, kChunkRows, kChunkCols, "activation_out");
  g.epilogue.store_gate_up = args.gate_up_out != nullptr;
  if (g.epilogue.store_gate_up) {
    g.epilogue.gate_up = make_tensor_map_2d(args.gate_up_out, buffer_rows, 2 * i, kChunkRows, kChunkCols, "gate_up_out");
  }
  g.epilogue.intermediate = args.intermediate;
  return g;
}

// y = activation · W_down[e]^T: activation [rows][I] and W_down [L][D][I], both K-major; y [rows][D]
// (y_out null: no output map, for a caller that stores the rows elsewhere).
struct DownProjDescriptors {
  MainloopParams mainloop;
  RowTileScheduler::Params tiles;
  RowsBf16Epilogue::Params epilogue;
};

inline DownProjDescriptors down_proj_descriptors(const DownProjArgs& args, uint64_t buffer_rows) {
  using Gemm = DownProjGemm;
  using Policy = Gemm::Policy;
  using MapsA = OperandMaps<Gemm::OperandA>;
  using MapsB = OperandMaps<Gemm::OperandB>;
  const uint64_t d = uint64_t(args.hidden);
  const uint64_t i = uint64_t(args.intermediate);
  DownProjDescriptors g{};
  g.mainloop.a = MapsA::make_map<Policy::A>(args.activation, buffer_rows, i, "activation");
  g.mainloop.b = MapsB::make_map<Policy::B>(args.w_down, uint64_t(args.rows.num_experts), d, i, "w_down");
  g.tiles = {args.rows, int((d + Policy::kBlockN - 1) / Policy::kBlockN), args.intermediate / Policy::kBlockK,
             args.tile_queue};
  if (args.y_out != nullptr) g.epilogue.out = make_tensor_map_2d(args.y_out, buffer_rows, d, kChunkRows, kChunkCols, "y_out");
  g.epilogue.cols = args.hidden;
  return g;
}

}  // namespace caracal::gemm
