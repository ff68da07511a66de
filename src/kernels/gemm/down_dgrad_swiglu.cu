// Backward step 1 over expert-contiguous rows: the down projection's dgrad d_h = dy · W_down[e]
// with the SwiGLU-backward + router-score epilogue (the only grouped-GEMM instantiation in this
// unit), then the fixed-order reduction of the router-score partials.
#include "caracal/kernels/grouped_gemm_backward.hpp"
#include "kernels/gemm/host_checks.hpp"
#include "kernels/gemm/launch.cuh"
#include "kernels/gemm/operand_loads.cuh"
#include "kernels/gemm/router_grad_reduce.hpp"
#include "kernels/gemm/row_tile_scheduler.cuh"
#include "kernels/gemm/swiglu_backward_epilogue.cuh"
#include "kernels/gemm/tensor_map.hpp"

namespace caracal::kernels {
namespace {

// d_h = dy · W_down[e]: rows [row_capacity][D] K-major; W_down [L][D][I] read as it is stored,
// K = D rows of N = I contiguous columns (MN-major).
struct DownDgradSwigluGemm {
  using OperandA = gemm::KMajorRows;
  using OperandB = gemm::MNMajorWeights;
  using Scheduler = gemm::RowTileScheduler;
  using Epilogue = gemm::SwigluBackwardEpilogue;
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

  uint64_t const rows = uint64_t(args.rows.row_capacity);
  uint64_t const d = uint64_t(args.hidden);
  uint64_t const i = uint64_t(args.intermediate);
  Params p{};
  p.a = KMajorRows::make_map<kBlockM>(args.dy, rows, d, "dy");
  p.b = MNMajorWeights::make_map<kBlockN>(args.w_down, uint64_t(args.rows.num_experts), d, i,
                                          "w_down");
  p.b_mn_extent = args.intermediate;
  p.out = make_tensor_map_2d(args.d_gate_up_out, rows, 2 * i, kChunkRows, kChunkCols,
                             "d_gate_up_out");
  p.out_aux = make_tensor_map_2d(args.scaled_hidden_out, rows, i, kChunkRows, kChunkCols,
                                 "scaled_hidden_out");
  p.store_aux = true;
  p.source = make_tensor_map_2d(args.gate_up, rows, 2 * i, kBlockM, kChunkCols, "gate_up");
  set_expert_rows(p, args.rows);
  p.n_blocks = intermediate_blocks(args.intermediate);
  p.k_tiles = args.hidden / kBlockK;
  p.out_cols = 2 * args.intermediate;
  p.aux_cols = args.intermediate;
  p.gate_up = args.gate_up;
  p.row_gates = args.gates;
  p.dg_partials = args.workspace;
  launch_grouped_gemm<DownDgradSwigluGemm>(p, max_row_tiles(p), args.num_ctas, stream, fn);
  reduce_router_grad(args.workspace, p.n_blocks, args.rows.expert_offset, args.rows.num_experts,
                     args.rows.row_capacity, args.d_gates_out, stream, fn);
}

}  // namespace caracal::kernels
