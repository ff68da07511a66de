// Forward down projection over expert-contiguous rows: the grouped-GEMM kernel with the plain
// bf16 epilogue (the only kernel instantiated in this unit).
#include "caracal/kernels/grouped_gemm.hpp"
#include "kernels/gemm/bf16_epilogue.cuh"
#include "kernels/gemm/host_checks.hpp"
#include "kernels/gemm/launch.cuh"
#include "kernels/gemm/operand_loads.cuh"
#include "kernels/gemm/row_tile_scheduler.cuh"
#include "kernels/gemm/tensor_map.hpp"

namespace caracal::kernels {
namespace {

// y = hidden · W_down[e]^T: rows [row_capacity][I] and weights [L][D][I], both K-major.
struct DownProjGemm {
  using OperandA = gemm::KMajorRows;
  using OperandB = gemm::KMajorWeights;
  using Scheduler = gemm::RowTileScheduler;
  using Epilogue = gemm::RowsBf16Epilogue;
};

}  // namespace

void grouped_down_proj(const DownProjArgs& args, cudaStream_t stream) {
  using namespace gemm;
  check_down_proj_args(args);
  if (args.rows.row_capacity == 0) return;

  uint64_t const rows = uint64_t(args.rows.row_capacity);
  uint64_t const d = uint64_t(args.hidden);
  uint64_t const i = uint64_t(args.intermediate);
  Params p{};
  p.a = KMajorRows::make_map<kBlockM>(args.hidden_in, rows, i, "hidden_in");
  p.b = KMajorWeights::make_map<kBlockN>(args.w_down, uint64_t(args.rows.num_experts), d, i,
                                         "w_down");
  p.out = make_tensor_map_2d(args.y_out, rows, d, kChunkRows, kChunkCols, "y_out");
  p.store_aux = false;
  set_expert_rows(p, args.rows);
  p.n_blocks = int((d + kBlockN - 1) / kBlockN);
  p.k_tiles = args.intermediate / kBlockK;
  p.out_cols = args.hidden;
  p.aux_cols = 0;
  launch_grouped_gemm<DownProjGemm>(p, max_row_tiles(p), args.num_ctas, stream,
                                    "grouped_down_proj");
}

}  // namespace caracal::kernels
