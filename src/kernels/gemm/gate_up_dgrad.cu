// Backward step 2 over expert-contiguous rows: dx = d_gate · W_gate[e] + d_up · W_up[e] as one
// GEMM over K = 2I with the interleaved operands (the interleave permutes K in both, so the sum is
// unchanged); the plain bf16 epilogue (the only grouped-GEMM instantiation in this unit).
#include "caracal/kernels/grouped_gemm_backward.hpp"
#include "kernels/gemm/bf16_epilogue.cuh"
#include "kernels/gemm/host_checks.hpp"
#include "kernels/gemm/launch.cuh"
#include "kernels/gemm/operand_loads.cuh"
#include "kernels/gemm/row_tile_scheduler.cuh"
#include "kernels/gemm/tensor_map.hpp"

namespace caracal::kernels {
namespace {

// dx = d_gate_up · W_gate_up[e]: rows [row_capacity][2I] K-major; W_gate_up [L][2I][D] read as it
// is stored, K = 2I rows of N = D contiguous columns (MN-major).
struct GateUpDgradGemm {
  using OperandA = gemm::KMajorRows;
  using OperandB = gemm::MNMajorWeights;
  using Scheduler = gemm::RowTileScheduler;
  using Epilogue = gemm::RowsBf16Epilogue;
};

}  // namespace

void grouped_gate_up_dgrad(const GateUpDgradArgs& args, cudaStream_t stream) {
  using namespace gemm;
  check_gate_up_dgrad_args(args);
  if (args.rows.row_capacity == 0) return;

  uint64_t const rows = uint64_t(args.rows.row_capacity);
  uint64_t const d = uint64_t(args.hidden);
  uint64_t const i = uint64_t(args.intermediate);
  Params p{};
  p.a = KMajorRows::make_map<kBlockM>(args.d_gate_up, rows, 2 * i, "d_gate_up");
  p.b = MNMajorWeights::make_map<kBlockN>(args.w_gate_up, uint64_t(args.rows.num_experts), 2 * i,
                                          d, "w_gate_up");
  p.b_mn_extent = args.hidden;
  p.out = make_tensor_map_2d(args.dx_out, rows, d, kChunkRows, kChunkCols, "dx_out");
  p.store_aux = false;
  set_expert_rows(p, args.rows);
  p.n_blocks = int((d + kBlockN - 1) / kBlockN);
  p.k_tiles = 2 * args.intermediate / kBlockK;
  p.out_cols = args.hidden;
  launch_grouped_gemm<GateUpDgradGemm>(p, max_row_tiles(p), args.num_ctas, stream,
                                       "grouped_gate_up_dgrad");
}

}  // namespace caracal::kernels
