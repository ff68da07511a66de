#pragma once
// The FP8 row GEMMs' mainloop maps and row tiles from their operands (the four launchers' shared
// part): e4m3 rows [buffer rows][K] with their scales times e4m3 weights [L][N][K] with theirs, both
// K-major, in the policy's tiles.
#include <cstdint>
#include <string>

#include "caracal/gemm/grouped_gemm_fp8.hpp"
#include "device/gemm/block_scaled_mainloop.cuh"
#include "device/gemm/grouped_gemm_kernel.cuh"
#include "device/gemm/row_tile_scheduler.cuh"
#include "gemm/operand_maps.hpp"

namespace caracal::gemm {

// The kernel parameters of an N x K FP8 row GEMM over `rows` but its epilogue's: the mainloop's maps
// (codes and scales of A = `a`, B = `b`; a Gemm gathering A has none for it) and the row tiles in the
// policy's tile.
template <class Gemm>
GemmParams<Gemm> fp8_row_gemm_params(const ScheduleView& rows, const Fp8RowOperand& a, const Fp8WeightOperand& b,
                                     uint64_t n, uint64_t k, const std::string& a_name, const std::string& b_name,
                                     uint32_t* tile_queue) {
  using Policy = typename Gemm::Policy;
  using MapsA = OperandMaps<typename Gemm::OperandA>;
  using MapsB = OperandMaps<typename Gemm::OperandB>;
  const uint64_t buffer_rows = uint64_t(rows.buffer_rows()), experts = uint64_t(rows.num_experts);
  GemmParams<Gemm> p{};
  if constexpr (!kGathersA<Gemm>) {  // else A's rows are gathered (Fp8UpGateSwigluArgs::x_tokens)
    p.mainloop.a = MapsA::template make_map<typename Policy::A>(a.codes, buffer_rows, k, (a_name + ".codes").c_str());
    p.mainloop.scales_a =
        MapsA::template make_scale_map<typename Policy::A>(a.scales, buffer_rows, k, (a_name + ".scales").c_str());
  }
  p.mainloop.b = MapsB::template make_map<typename Policy::B>(b.codes, experts, n, k, (b_name + ".codes").c_str());
  p.mainloop.scales_b =
      MapsB::template make_scale_map<typename Policy::B>(b.scales, experts, n, k, (b_name + ".scales").c_str());
  p.scheduler = {rows, int((n + Policy::kBlockN - 1) / Policy::kBlockN), int(k) / Policy::kBlockK, tile_queue};
  return p;
}

}  // namespace caracal::gemm
