#pragma once
// Ping-pong consumers (a Gemm declaring `static constexpr bool kPingPong = true`): the producer
// streams each tile as two 64-row halves, one after the other through the stage ring (A's 64 rows
// of the half, B whole), and consumer warpgroup w computes half w alone, so one warpgroup's
// epilogue runs under the other's mainloop instead of both idling the tensor cores at once.
//
// The two warpgroups run their mainloops strictly in turn (MainloopTurns): warpgroup 0's of tile t,
// warpgroup 1's of tile t, warpgroup 0's of tile t + 1, ... Each walks the whole ring, passing over
// the other's stages (PipelineState::skip) without waiting on them. The turns are what make that
// safe: an mbarrier wait names its phase by parity only, so a warpgroup that ran more than one lap
// of the ring ahead of the fills would take an old phase for the one it waits for. In turn, a
// warpgroup only waits on stages the other has just waited on before it, at most one lap ahead.
// Tiles from a tile queue are taken in turn too (warpgroup 0 waits on the tile's first stage and
// hands the index to warpgroup 1 in shared memory, before passing the turn).
#include <cstdint>

#include <cutlass/arch/barrier.h>

#include "device/gemm/gathered_rows.cuh"  // kGatherBarrier: the named barriers below follow it
#include "device/gemm/gemm_config.cuh"
#include "device/gemm/tile_coord.cuh"

namespace caracal::gemm {

// Named barriers (cutlass::arch::NamedBarrier ids): a warpgroup's chunk store ring takes its index
// (0, 1), the gathering producer kGatherBarrier; warpgroup w waits for its turn on kTurnBarrier + w.
inline constexpr uint32_t kTurnBarrier = kGatherBarrier + 1;

class MainloopTurns {
 public:
  __device__ explicit MainloopTurns(int warpgroup) : warpgroup_(warpgroup), first_(true) {}

  // All threads of the warpgroup: returns once the other warpgroup has passed the turn (warpgroup
  // 0's first turn is its own).
  __device__ void wait() {
    if (first_) {
      first_ = false;
      if (warpgroup_ == 0) return;
    }
    cutlass::arch::NamedBarrier::sync(2 * kWarpgroupThreads, kTurnBarrier + warpgroup_);
  }
  // All threads of the warpgroup: the other warpgroup's turn. Orders this warpgroup's shared-memory
  // writes before the other's reads after its wait.
  __device__ void pass() const {
    cutlass::arch::NamedBarrier::arrive(2 * kWarpgroupThreads, kTurnBarrier + 1 - warpgroup_);
  }

 private:
  int warpgroup_;
  bool first_;
};

// Whether the producer streams half `half` of a ping-pong tile: half 0 always (a tile with no rows
// to compute walks the ring as a cooperative one does), half 1 only when it holds rows to compute.
__device__ inline bool half_streamed(TileCoord const& tile, int half) {
  return half == 0 || tile.m_begin + kWarpgroupRows < tile.active_end;
}

// The stages of half `half` of a ping-pong tile.
__device__ inline int half_stages(TileCoord const& tile, int half) {
  return half_streamed(tile, half) ? tile.k_tiles : 0;
}

}  // namespace caracal::gemm
