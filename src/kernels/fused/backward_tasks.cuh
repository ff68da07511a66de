#pragma once
// The fused backward's compute tasks (DESIGN §3) of one rank over one window of the ring, in one
// order: the routed experts' dgrad+SwiGLU tiles, then their dx tiles (each phase in
// RowTileScheduler's order over the window's blocks). The rank's compute CTAs take them in that
// order from one counter, as the fused forward's (forward_tasks.cuh). A dgrad tile waits for its
// block's dy rows (raised by the comm role as they land), a dx tile for its block's d_gate_up
// (raised by the block's dgrad tiles, of lower index); tasks are taken in increasing order, only by
// running CTAs, and every CTA of the (cooperative) launch is resident, so the smallest unfinished
// task can always run: no deadlock. Which CTA runs a tile changes nothing in its result (one CTA
// per tile, K in a fixed order).
#include "device/gemm/row_tile_scheduler.cuh"
#include "device/gemm/tile_coord.cuh"

namespace caracal::fused {

// In task order; end: no more tasks for this CTA.
enum class BackwardPhase : int { dgrad, dx, end };

struct BackwardTask {
  BackwardPhase phase;
  gemm::TileCoord tile;
  // The tile's 128-row block among the window's (its buffer rows: the counters' index).
  __device__ int buffer_block() const { return tile.m_buffer / gemm::kBlockM; }
};

// As the forward's TaskSlot: one per pipeline stage of a CTA, in global memory.
struct BackwardTaskSlot {
  BackwardTask task;
};
static_assert(sizeof(BackwardTaskSlot) == 32);

// The two GEMMs' tiles over the same row blocks (the pass's window); group_dx: the dx rows of
// tokens on other ranks are summed per (token, rank) before they go home (dx_group_sums.cuh).
struct BackwardTiles {
  gemm::RowTileScheduler::Params dgrad;
  gemm::RowTileScheduler::Params dx;
  bool group_dx;
};

// Maps task indices, given in increasing order, to tiles (each role of a CTA keeps its own).
class BackwardTaskCursor {
 public:
  // `tiles` must outlive the cursor (kernel parameters do).
  __device__ explicit BackwardTaskCursor(const BackwardTiles& tiles) : tiles_(&tiles), current_(tiles.dgrad, 0, 1) {
    dgrad_tasks_ = current_.num_tiles();
    end_ = dgrad_tasks_ + gemm::RowTileScheduler(tiles.dx, 0, 1).num_tiles();
  }

  __device__ int num_tasks() const { return end_; }

  // Task `task` (in [0, num_tasks()), at or past the last one asked for).
  __device__ BackwardTask at(int task) {
    const bool dx = task >= dgrad_tasks_;
    if (dx && !in_dx_) {
      in_dx_ = true;
      current_ = gemm::RowTileScheduler(tiles_->dx, 0, 1);
    }
    current_.seek(dx ? task - dgrad_tasks_ : task);
    gemm::TileCoord tile = current_.coord();
    gemm::RowTileScheduler::locate(tiles_->dgrad, tile);
    return BackwardTask{dx ? BackwardPhase::dx : BackwardPhase::dgrad, tile};
  }

 private:
  const BackwardTiles* tiles_;
  gemm::RowTileScheduler current_;  // the current phase's tiles
  int dgrad_tasks_;
  int end_;
  bool in_dx_ = false;
};

}  // namespace caracal::fused
