// Forward up/gate + SwiGLU over expert-contiguous rows: the grouped-GEMM kernel with the SwiGLU
// epilogue (the only kernel instantiated in this unit).
#include "caracal/kernels/grouped_gemm.hpp"
#include "kernels/gemm/host_checks.hpp"
#include "kernels/gemm/launch.cuh"
#include "kernels/gemm/operand_loads.cuh"
#include "kernels/gemm/row_tile_scheduler.cuh"
#include "kernels/gemm/swiglu_epilogue.cuh"
#include "kernels/gemm/tensor_map.hpp"

namespace caracal::kernels {
namespace {

// gate_up = x · W_gate_up[e]^T: rows [row_capacity][D] and weights [L][2I][D], both K-major.
struct UpGateSwigluGemm {
  using OperandA = gemm::KMajorRows;
  using OperandB = gemm::KMajorWeights;
  using Scheduler = gemm::RowTileScheduler;
  using Epilogue = gemm::UpGateSwigluEpilogue;
};

}  // namespace

void grouped_up_gate_swiglu(const UpGateSwigluArgs& args, cudaStream_t stream) {
  using namespace gemm;
  check_up_gate_swiglu_args(args);
  if (args.rows.row_capacity == 0) return;

  uint64_t const rows = uint64_t(args.rows.row_capacity);
  uint64_t const d = uint64_t(args.hidden);
  uint64_t const i = uint64_t(args.intermediate);
  Params p{};
  p.a = KMajorRows::make_map<kBlockM>(args.x, rows, d, "x");
  p.b = KMajorWeights::make_map<kBlockN>(args.w_gate_up, uint64_t(args.rows.num_experts), 2 * i, d,
                                         "w_gate_up");
  p.out = make_tensor_map_2d(args.hidden_out, rows, i, kChunkRows, kChunkCols, "hidden_out");
  p.store_aux = args.gate_up_out != nullptr;
  if (p.store_aux) {
    p.out_aux =
        make_tensor_map_2d(args.gate_up_out, rows, 2 * i, kChunkRows, kChunkCols, "gate_up_out");
  }
  set_expert_rows(p, args.rows);
  p.n_blocks = int((2 * i + kBlockN - 1) / kBlockN);
  p.k_tiles = args.hidden / kBlockK;
  p.out_cols = args.intermediate;
  p.aux_cols = 2 * args.intermediate;
  launch_grouped_gemm<UpGateSwigluGemm>(p, max_row_tiles(p), args.num_ctas, stream,
                                        "grouped_up_gate_swiglu");
}

}  // namespace caracal::kernels
