// Forward down projection over expert-contiguous rows: the grouped-GEMM kernel with the plain
// bf16 epilogue (the only kernel instantiated in this unit).
#include "caracal/gemm/grouped_gemm.hpp"
#include "device/gemm/bf16_epilogue.cuh"
#include "device/gemm/operand_loads.cuh"
#include "device/gemm/row_tile_scheduler.cuh"
#include "gemm/host_checks.hpp"
#include "gemm/launch.cuh"
#include "gemm/tensor_map.hpp"

namespace caracal::gemm {
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
  GemmParams<DownProjGemm> p{};
  p.mainloop.a = KMajorRows::make_map<kBlockM>(args.activation, rows, i, "activation");
  p.mainloop.b = KMajorWeights::make_map<kBlockN>(args.w_down, uint64_t(args.rows.num_experts), d, i, "w_down");
  p.scheduler = {args.rows, int((d + kBlockN - 1) / kBlockN), args.intermediate / kBlockK};
  p.epilogue = {make_tensor_map_2d(args.y_out, rows, d, kChunkRows, kChunkCols, "y_out"), args.hidden};
  launch_grouped_gemm<DownProjGemm>(p, args.num_ctas, stream, "grouped_down_proj");
}

}  // namespace caracal::gemm
