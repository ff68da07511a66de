#pragma once
// The fused backward's compute tasks (DESIGN §3) of one rank over one window of the ring, in one
// order: with has_shared (the launch over window 0) the shared expert's dgrad+SwiGLU tiles and its
// dx tiles first (they need no pulled rows: they fill the SMs while the first pulls are in flight),
// then the routed experts' dgrad+SwiGLU tiles, then their dx tiles (each phase in
// RowTileScheduler's order over its blocks). The rank's compute CTAs take them in that order from
// one counter, as the fused forward's (forward_tasks.cuh). A routed dgrad tile waits for its
// block's dy rows (raised by the comm role as they land), a dx tile for its block's d_gate_up
// (raised by the block's dgrad tiles, of lower index); the shared expert's dgrad tiles wait on
// nothing; tasks are taken in increasing order, only by running CTAs, and every CTA of the
// (cooperative) launch is resident, so the smallest unfinished task can always run: no deadlock.
// Which CTA runs a tile changes nothing in its result (one CTA per tile, K in a fixed order).
// Host code walks the same cursor (tests/unit/test_task_order.cpp checks the order and that rule).
#include "device/common/host_device.hpp"
#include "device/gemm/row_tile_scheduler.cuh"
#include "device/gemm/tile_coord.cuh"

namespace caracal::fused {

// In task order; end: no more tasks for this CTA.
enum class BackwardPhase : int { shared_dgrad, shared_dx, dgrad, dx, end };

struct BackwardTask {
  BackwardPhase phase;
  gemm::TileCoord tile;
  // The tile's 128-row block among its rows' (the window's buffer rows, or the shared expert's):
  // the counters' index.
  CARACAL_HOST_DEVICE int buffer_block() const { return tile.m_buffer / gemm::kBlockM; }
  CARACAL_HOST_DEVICE bool dgrad() const {
    return phase == BackwardPhase::dgrad || phase == BackwardPhase::shared_dgrad;
  }
  CARACAL_HOST_DEVICE bool shared() const {
    return phase == BackwardPhase::shared_dgrad || phase == BackwardPhase::shared_dx;
  }
};

// As the forward's TaskSlot: one per pipeline stage of a CTA, in global memory.
struct BackwardTaskSlot {
  BackwardTask task;
};
static_assert(sizeof(BackwardTaskSlot) == 32);

// The two GEMMs' tiles over the same row blocks (the pass's window), and with has_shared the
// shared expert's over its rows; group_dx: the dx rows of tokens on other ranks are summed per
// (token, rank) before they go home (dx_group_sums.cuh).
struct BackwardTiles {
  gemm::RowTileScheduler::Params dgrad;
  gemm::RowTileScheduler::Params dx;
  gemm::RowTileScheduler::Params shared_dgrad;
  gemm::RowTileScheduler::Params shared_dx;
  bool has_shared;
  bool group_dx;

  // A phase's tiles (not BackwardPhase::end).
  CARACAL_HOST_DEVICE const gemm::RowTileScheduler::Params& of(BackwardPhase phase) const {
    switch (phase) {
      case BackwardPhase::shared_dgrad: return shared_dgrad;
      case BackwardPhase::shared_dx: return shared_dx;
      case BackwardPhase::dgrad: return dgrad;
      default: return dx;
    }
  }
};

// Maps task indices, given in increasing order, to tiles (each role of a CTA keeps its own) of N
// `BlockN` (the GEMMs' policy's kBlockN).
template <int BlockN>
class BackwardTaskCursorOf {
 public:
  // `tiles` must outlive the cursor (kernel parameters do).
  CARACAL_HOST_DEVICE explicit BackwardTaskCursorOf(const BackwardTiles& tiles) : tiles_(&tiles) {
    shared_dgrad_end_ = tiles.has_shared ? tiles_in(BackwardPhase::shared_dgrad) : 0;
    shared_dx_end_ = shared_dgrad_end_ + (tiles.has_shared ? tiles_in(BackwardPhase::shared_dx) : 0);
    dgrad_end_ = shared_dx_end_ + tiles_in(BackwardPhase::dgrad);
    dx_end_ = dgrad_end_ + tiles_in(BackwardPhase::dx);
  }

  CARACAL_HOST_DEVICE int num_tasks() const { return dx_end_; }

  // Task `task` (in [0, num_tasks()), at or past the last one asked for).
  CARACAL_HOST_DEVICE BackwardTask at(int task) {
    // Named ends, not an array: an array indexed at run time would live in local memory.
    const BackwardPhase phase = task < shared_dgrad_end_ ? BackwardPhase::shared_dgrad
                                : task < shared_dx_end_  ? BackwardPhase::shared_dx
                                : task < dgrad_end_      ? BackwardPhase::dgrad
                                                         : BackwardPhase::dx;
    const int begin = phase == BackwardPhase::shared_dgrad ? 0
                      : phase == BackwardPhase::shared_dx  ? shared_dgrad_end_
                      : phase == BackwardPhase::dgrad      ? shared_dx_end_
                                                           : dgrad_end_;
    const gemm::RowTileParams& params = tiles_->of(phase);
    if (phase != phase_) {
      phase_ = phase;
      current_ = Scheduler(params, 0, 1);
    }
    current_.seek(task - begin);
    gemm::TileCoord tile = current_.coord();
    gemm::RowTileScheduler::locate(params, tile);
    return BackwardTask{phase, tile};
  }

 private:
  using Scheduler = gemm::RowTileSchedulerOf<BlockN>;
  CARACAL_HOST_DEVICE int tiles_in(BackwardPhase phase) const { return Scheduler(tiles_->of(phase), 0, 1).num_tiles(); }

  const BackwardTiles* tiles_;
  Scheduler current_;  // the current phase's tiles
  int shared_dgrad_end_, shared_dx_end_, dgrad_end_, dx_end_;  // one past each phase's last task
  BackwardPhase phase_ = BackwardPhase::end;
};
// The bf16 GEMMs' tiles.
using BackwardTaskCursor = BackwardTaskCursorOf<gemm::kBlockN>;

}  // namespace caracal::fused
