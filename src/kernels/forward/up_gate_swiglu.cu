// Forward up/gate + SwiGLU over expert-contiguous rows: the grouped-GEMM kernel with the SwiGLU
// epilogue (the only kernel instantiated in this unit).
#include "caracal/gemm/grouped_gemm.hpp"
#include "device/gemm/operand_loads.cuh"
#include "device/gemm/row_tile_scheduler.cuh"
#include "device/gemm/swiglu_epilogue.cuh"
#include "gemm/host_checks.hpp"
#include "gemm/launch.cuh"
#include "gemm/tensor_map.hpp"

namespace caracal::gemm {
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
  GemmParams<UpGateSwigluGemm> p{};
  p.mainloop.a = KMajorRows::make_map<kBlockM>(args.x, rows, d, "x");
  p.mainloop.b = KMajorWeights::make_map<kBlockN>(args.w_gate_up, uint64_t(args.rows.num_experts), 2 * i, d,
                                                  "w_gate_up");
  p.scheduler = {args.rows, int((2 * i + kBlockN - 1) / kBlockN), args.hidden / kBlockK};
  p.epilogue.activation = make_tensor_map_2d(args.activation_out, rows, i, kChunkRows, kChunkCols, "activation_out");
  p.epilogue.store_gate_up = args.gate_up_out != nullptr;
  if (p.epilogue.store_gate_up) {
    p.epilogue.gate_up = make_tensor_map_2d(args.gate_up_out, rows, 2 * i, kChunkRows, kChunkCols, "gate_up_out");
  }
  p.epilogue.intermediate = args.intermediate;
  launch_grouped_gemm<UpGateSwigluGemm>(p, args.num_ctas, stream, "grouped_up_gate_swiglu");
}

}  // namespace caracal::gemm
