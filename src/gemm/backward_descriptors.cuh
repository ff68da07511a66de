#pragma once
// The backward dx GEMM's descriptors from its arguments, for the standalone launcher
// (src/kernels/backward/gate_up_dgrad.cu) and the one that stores the rows home
// (src/kernels/fused/dx_to_home.cu).
#include <cstdint>

#include "caracal/gemm/grouped_gemm_backward.hpp"
#include "device/gemm/mainloop.cuh"
#include "device/gemm/operand_loads.cuh"
#include "device/gemm/row_tile_scheduler.cuh"

namespace caracal::gemm {

// dx = d_gate_up · W_gate_up[e]: d_gate_up [rows][2I] K-major; W_gate_up [L][2I][D] read as it is
// stored, K = 2I rows of N = D contiguous columns (MN-major).
struct GateUpDgradDescriptors {
  MainloopParams mainloop;
  RowTileScheduler::Params tiles;
};

inline GateUpDgradDescriptors gate_up_dgrad_descriptors(const GateUpDgradArgs& args) {
  const uint64_t rows = uint64_t(args.rows.buffer_rows());
  const uint64_t d = uint64_t(args.hidden);
  const uint64_t i = uint64_t(args.intermediate);
  GateUpDgradDescriptors g{};
  g.mainloop.a = KMajorRows::make_map<kBlockM>(args.d_gate_up, rows, 2 * i, "d_gate_up");
  g.mainloop.b =
      MNMajorWeights::make_map<kBlockN>(args.w_gate_up, uint64_t(args.rows.num_experts), 2 * i, d, "w_gate_up");
  g.mainloop.b_mn_extent = args.hidden;
  g.tiles = {args.rows, int((d + kBlockN - 1) / kBlockN), 2 * args.intermediate / kBlockK, args.tile_queue};
  return g;
}

}  // namespace caracal::gemm
