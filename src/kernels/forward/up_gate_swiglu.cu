// Forward up/gate + SwiGLU over expert-contiguous rows: the grouped-GEMM kernel with the SwiGLU
// epilogue (the only kernel instantiated in this unit).
#include "caracal/gemm/grouped_gemm.hpp"
#include "device/gemm/operand_loads.cuh"
#include "device/gemm/row_tile_scheduler.cuh"
#include "device/gemm/swiglu_epilogue.cuh"
#include "gemm/forward_descriptors.cuh"
#include "gemm/host_checks.hpp"
#include "gemm/launch.cuh"

namespace caracal::gemm {
namespace {

// gate_up = x · W_gate_up[e]^T: rows [row_capacity][D] and weights [L][2I][D], both K-major.
struct UpGateSwigluGemm {
  using OperandA = gemm::KMajorRows;
  using OperandB = gemm::KMajorWeights;
  using Scheduler = gemm::RowTilePairScheduler;  // CTA pairs sharing an operand (paired_gemm_kernel.cuh)
  static constexpr gemm::RegisterSplit kRegisterSplit = gemm::kPairRegisterSplit;
  using Epilogue = gemm::UpGateSwigluEpilogue;
};

}  // namespace

void grouped_up_gate_swiglu(const UpGateSwigluArgs& args, cudaStream_t stream) {
  using namespace gemm;
  check_up_gate_swiglu_args(args);
  if (args.rows.row_capacity == 0) return;

  const UpGateSwigluDescriptors g = up_gate_swiglu_descriptors(args, uint64_t(args.rows.buffer_rows()));
  GemmParams<UpGateSwigluGemm> p{};
  p.mainloop = g.mainloop;
  p.scheduler = g.tiles;
  p.epilogue = g.epilogue;
  launch_grouped_gemm<UpGateSwigluGemm>(p, args.num_ctas, stream, "grouped_up_gate_swiglu");
}

}  // namespace caracal::gemm
