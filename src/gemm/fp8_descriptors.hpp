#pragma once
// The FP8 forward GEMMs' mainloop maps and row tiles from their operands (the two launchers'
// shared part): e4m3 rows [buffer rows][K] with their scales times e4m3 weights [L][N][K] with
// theirs, both K-major, in 128 x 128 tiles.
#include <cstdint>
#include <string>

#include "caracal/gemm/grouped_gemm_fp8.hpp"
#include "device/gemm/block_scaled_mainloop.cuh"
#include "device/gemm/row_tile_scheduler.cuh"
#include "gemm/operand_maps.hpp"

namespace caracal::gemm {

template <class Gemm>
typename Mainloop<typename Gemm::Policy>::Params fp8_mainloop_params(const ScheduleView& rows_view,
                                                                   const Fp8RowOperand& a, const Fp8WeightOperand& b,
                                                                   uint64_t n, uint64_t k, const std::string& a_name,
                                                                   const std::string& b_name) {
  using Policy = typename Gemm::Policy;
  using MapsA = OperandMaps<typename Gemm::OperandA>;
  using MapsB = OperandMaps<typename Gemm::OperandB>;
  const uint64_t rows = uint64_t(rows_view.buffer_rows()), experts = uint64_t(rows_view.num_experts);
  typename Mainloop<Policy>::Params p{};
  p.a = MapsA::template make_map<typename Policy::A>(a.codes, rows, k, (a_name + ".codes").c_str());
  p.b = MapsB::template make_map<typename Policy::B>(b.codes, experts, n, k, (b_name + ".codes").c_str());
  p.scales_a = MapsA::template make_scale_map<typename Policy::A>(a.scales, rows, k, (a_name + ".scales").c_str());
  p.scales_b =
      MapsB::template make_scale_map<typename Policy::B>(b.scales, experts, n, k, (b_name + ".scales").c_str());
  return p;
}

// The row tiles of an N x K GEMM over `rows` in the policy's tile.
template <class Gemm>
RowTileParams fp8_row_tiles(const ScheduleView& rows, uint64_t n, uint64_t k, uint32_t* tile_queue) {
  using Policy = typename Gemm::Policy;
  return {rows, int((n + Policy::kBlockN - 1) / Policy::kBlockN), int(k) / Policy::kBlockK, tile_queue};
}

}  // namespace caracal::gemm
