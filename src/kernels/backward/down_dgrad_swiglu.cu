// Backward step 1 over expert-contiguous rows: the down projection's dgrad d_h = dy · W_down[e]
// with the SwiGLU-backward + router-score epilogue (the only grouped-GEMM instantiation in this
// unit), then the fixed-order reduction of the router-score partials.
#include "caracal/gemm/grouped_gemm_backward.hpp"
#include "device/gemm/operand_loads.cuh"
#include "device/gemm/row_tile_scheduler.cuh"
#include "device/gemm/swiglu_backward_epilogue.cuh"
#include "gemm/host_checks.hpp"
#include "gemm/launch.cuh"
#include "gemm/router_grad_reduce.hpp"
#include "gemm/tensor_map.hpp"

namespace caracal::gemm {
namespace {

// d_h = dy · W_down[e]: rows [row_capacity][D] K-major; W_down [L][D][I] read as it is stored,
// K = D rows of N = I contiguous columns (MN-major).
struct DownDgradSwigluGemm {
  using OperandA = gemm::KMajorRows;
  using OperandB = gemm::MNMajorWeights;
  using Scheduler = gemm::RowTileScheduler;
  using Epilogue = gemm::SwigluBackwardEpilogue;
  // Its producer also prefetches the epilogue's gate/up: with the tile queue's take it spills two
  // registers at 40 (ptxas, 2026-12-01); the consumers need no more than 224.
  static constexpr gemm::RegisterSplit kRegisterSplit{48, 224};
};

int intermediate_blocks(int intermediate) {
  return (intermediate + gemm::kBlockN - 1) / gemm::kBlockN;
}

}  // namespace

size_t down_dgrad_workspace_floats(int row_capacity, int intermediate) {
  if (row_capacity <= 0 || intermediate <= 0) return 0;
  return size_t(row_capacity) * size_t(intermediate_blocks(intermediate));
}

void grouped_down_dgrad_swiglu(const DownDgradSwigluArgs& args, cudaStream_t stream) {
  using namespace gemm;
  const char* fn = "grouped_down_dgrad_swiglu";
  check_down_dgrad_swiglu_args(args);
  if (args.rows.row_capacity == 0) return;

  uint64_t const rows = uint64_t(args.rows.buffer_rows());
  uint64_t const d = uint64_t(args.hidden);
  uint64_t const i = uint64_t(args.intermediate);
  int const n_blocks = intermediate_blocks(args.intermediate);
  GemmParams<DownDgradSwigluGemm> p{};
  p.mainloop.a = KMajorRows::make_map<kBlockM>(args.dy, rows, d, "dy");
  p.mainloop.b = MNMajorWeights::make_map<kBlockN>(args.w_down, uint64_t(args.rows.num_experts), d, i, "w_down");
  p.mainloop.b_mn_extent = args.intermediate;
  p.scheduler = {args.rows, n_blocks, args.hidden / kBlockK, args.tile_queue};
  SwigluBackwardEpilogue::Params& e = p.epilogue;
  e.d_gate_up = make_tensor_map_2d(args.d_gate_up_out, rows, 2 * i, kChunkRows, kChunkCols, "d_gate_up_out");
  e.scaled_activation =
      make_tensor_map_2d(args.scaled_activation_out, rows, i, kChunkRows, kChunkCols, "scaled_activation_out");
  e.gate_up_source = make_tensor_map_2d(args.gate_up, rows, 2 * i, kBlockM, kChunkCols, "gate_up");
  e.gate_up = args.gate_up;
  e.row_gates = args.gates;
  e.dg_partials = args.workspace;
  e.intermediate = args.intermediate;
  e.n_blocks = n_blocks;
  launch_grouped_gemm<DownDgradSwigluGemm>(p, args.num_ctas, stream, fn);
  reduce_router_grad(args.workspace, n_blocks, args.rows, args.d_gates_out, stream, fn);
}

}  // namespace caracal::gemm
