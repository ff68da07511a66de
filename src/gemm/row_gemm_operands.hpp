#pragma once
// A row GEMM's operands (M = the schedule's rows): its mainloop's TMA maps and its tiles, from the
// rows' buffer and the experts' weights, as every bf16 row GEMM's descriptors build them
// (forward_descriptors.cuh, backward_descriptors.cuh).
#include <cstdint>

#include "caracal/schedule_view.hpp"
#include "device/gemm/mainloop.cuh"
#include "device/gemm/row_tile_scheduler.cuh"
#include "gemm/operand_maps.hpp"

namespace caracal::gemm {

struct RowGemmOperands {
  MainloopParams mainloop;
  RowTileScheduler::Params tiles;
};

// With its epilogue's parameters: a row GEMM's descriptors.
template <class Epilogue>
struct RowGemmDescriptors : RowGemmOperands {
  typename Epilogue::Params epilogue;
};

// A = `a`, [buffer_rows][k] rows (K-major); B = `b`, the experts' weights as Gemm::OperandB holds
// them: [L][n][k] (K-major) or [L][k][n] (MN-major, its N extent n); the output N = n.
template <class Gemm>
RowGemmOperands row_gemm_operands(const ScheduleView& rows, uint32_t* tile_queue, uint64_t buffer_rows,
                                  const void* a, const char* a_name, const void* b, const char* b_name, uint64_t n,
                                  uint64_t k) {
  using Policy = typename Gemm::Policy;
  using MapsA = OperandMaps<typename Gemm::OperandA>;
  using MapsB = OperandMaps<typename Gemm::OperandB>;
  static_assert(Gemm::OperandA::kMajor == Major::K, "a row GEMM's A is its rows, K-major");
  const uint64_t experts = uint64_t(rows.num_experts);
  RowGemmOperands o{};
  o.mainloop.a = MapsA::template make_map<typename Policy::A>(a, buffer_rows, k, a_name);
  if constexpr (Gemm::OperandB::kMajor == Major::K) {
    o.mainloop.b = MapsB::template make_map<typename Policy::B>(b, experts, n, k, b_name);
  } else {
    o.mainloop.b = MapsB::template make_map<typename Policy::B>(b, experts, k, n, b_name);
    o.mainloop.b_mn_extent = int(n);
  }
  o.tiles = {rows, int((n + Policy::kBlockN - 1) / Policy::kBlockN), int(k / Policy::kBlockK), tile_queue};
  return o;
}

}  // namespace caracal::gemm
