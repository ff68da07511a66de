// Forward down projection over expert-contiguous rows: the grouped-GEMM kernel with the plain
// bf16 epilogue (the only kernel instantiated in this unit).
#include "caracal/gemm/grouped_gemm.hpp"
#include "device/gemm/bf16_epilogue.cuh"
#include "device/gemm/operand_loads.cuh"
#include "device/gemm/row_tile_scheduler.cuh"
#include "gemm/forward_descriptors.cuh"
#include "gemm/host_checks.hpp"
#include "gemm/launch.cuh"

namespace caracal::gemm {
namespace {

// y = hidden · W_down[e]^T: rows [row_capacity][I] and weights [L][D][I], both K-major.
struct DownProjGemm {
  using OperandA = gemm::KMajorRows;
  using OperandB = gemm::KMajorWeights;
  using Scheduler = gemm::RowTilePairScheduler;  // CTA pairs sharing an operand (paired_gemm_kernel.cuh)
  static constexpr gemm::RegisterSplit kRegisterSplit = gemm::kPairRegisterSplit;
  using Epilogue = gemm::RowsBf16Epilogue;
};

}  // namespace

void grouped_down_proj(const DownProjArgs& args, cudaStream_t stream) {
  using namespace gemm;
  check_down_proj_args(args);
  if (args.rows.row_capacity == 0) return;

  const DownProjDescriptors g = down_proj_descriptors(args, uint64_t(args.rows.buffer_rows()));
  GemmParams<DownProjGemm> p{};
  p.mainloop = g.mainloop;
  p.scheduler = g.tiles;
  p.epilogue = g.epilogue;
  launch_grouped_gemm<DownProjGemm>(p, args.num_ctas, stream, "grouped_down_proj");
}

}  // namespace caracal::gemm
