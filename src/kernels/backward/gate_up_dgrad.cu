// Backward step 2 over expert-contiguous rows: dx = d_gate · W_gate[e] + d_up · W_up[e] as one
// GEMM over K = 2I with the interleaved operands (the interleave permutes K in both, so the sum is
// unchanged); the plain bf16 epilogue (the only grouped-GEMM instantiation in this unit).
#include "caracal/gemm/grouped_gemm_backward.hpp"
#include "device/gemm/bf16_epilogue.cuh"
#include "device/gemm/operand_loads.cuh"
#include "device/gemm/row_tile_scheduler.cuh"
#include "gemm/backward_descriptors.cuh"
#include "gemm/host_checks.hpp"
#include "gemm/launch.cuh"
#include "gemm/tensor_map.hpp"

namespace caracal::gemm {
namespace {

// dx = d_gate_up · W_gate_up[e]: rows [row_capacity][2I] K-major; W_gate_up [L][2I][D] read as it
// is stored, K = 2I rows of N = D contiguous columns (MN-major).
struct GateUpDgradGemm {
  using OperandA = gemm::KMajorRows;
  using OperandB = gemm::MNMajorWeights;
  using Scheduler = gemm::RowTilePairScheduler;  // CTA pairs sharing an operand (paired_gemm_kernel.cuh)
  static constexpr gemm::RegisterSplit kRegisterSplit = gemm::kPairRegisterSplit;
  using Epilogue = gemm::RowsBf16Epilogue;
};

}  // namespace

void grouped_gate_up_dgrad(const GateUpDgradArgs& args, cudaStream_t stream) {
  using namespace gemm;
  check_gate_up_dgrad_args(args);
  if (args.rows.row_capacity == 0) return;

  const GateUpDgradDescriptors g = gate_up_dgrad_descriptors(args);
  GemmParams<GateUpDgradGemm> p{};
  p.mainloop = g.mainloop;
  p.scheduler = g.tiles;
  p.epilogue = {make_tensor_map_2d(args.dx_out, uint64_t(args.rows.buffer_rows()), uint64_t(args.hidden), kChunkRows,
                                   kChunkCols, "dx_out"),
                args.hidden};
  launch_grouped_gemm<GateUpDgradGemm>(p, args.num_ctas, stream, "grouped_gate_up_dgrad");
}

}  // namespace caracal::gemm
