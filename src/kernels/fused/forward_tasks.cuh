#pragma once
// The fused forward's compute tasks (DESIGN §3) of one rank, in one order: all up/gate+SwiGLU tiles
// first (RowTileScheduler's order), then all down-projection tiles; task t < n_up is up/gate tile
// t, task t >= n_up is down tile t - n_up. The rank's compute CTAs take tasks in that order from
// one counter (atomicAdd), so a CTA that finishes early, or a comm CTA whose pulls are done, takes
// the next. Each task waits only on counters raised by the comm CTAs (x rows pulled) or by tasks
// of lower index (an M block's activation complete); tasks are taken in increasing order and every
// CTA of the launch is resident, so the smallest unfinished task can always run: no deadlock.
// Which CTA runs a task changes nothing in its result (one CTA per tile, K in a fixed order).
#include "device/gemm/row_tile_scheduler.cuh"
#include "device/gemm/tile_coord.cuh"

namespace caracal::fused {

enum class ForwardPhase : int { up_gate, down, end };  // end: no more tasks for this CTA

struct ForwardTask {
  ForwardPhase phase;
  gemm::TileCoord tile;
  __device__ int m_block() const { return tile.m_begin / gemm::kBlockM; }
};

// Where the producer hands a tile's task to the consumers: one slot per pipeline stage of the CTA,
// in global memory, published by the stage's barriers (written before the stage's loads are
// announced, read after they land; rewritten only after every consumer warp released the stage).
// In shared memory compute-sanitizer's racecheck reports these accesses, as it does not follow a
// stage barrier's arrivals from the reading warps' lane 0; global memory it does not check, and
// the barriers order accesses there the same way (CTA scope).
struct TaskSlot {
  ForwardTask task;
  int pad;  // 32 bytes a slot
};
static_assert(sizeof(TaskSlot) == 32);

// Maps task indices, given in increasing order, to tiles (each role of a CTA keeps its own).
class ForwardTaskCursor {
 public:
  // `down` must outlive the cursor (kernel parameters do).
  __device__ ForwardTaskCursor(const gemm::RowTileScheduler::Params& up, const gemm::RowTileScheduler::Params& down)
      : tiles_(up, 0, 1), down_(&down) {
    n_up_ = tiles_.num_tiles();
  }

  // Both GEMMs run over the same row blocks.
  __device__ int num_tasks(const gemm::RowTileScheduler::Params& up) const {
    return n_up_ + n_up_ / up.n_blocks * down_->n_blocks;
  }

  // Task `task` (in [0, num_tasks()), at or past the last one asked for).
  __device__ ForwardTask at(int task) {
    if (task >= n_up_ && phase_ == ForwardPhase::up_gate) {
      phase_ = ForwardPhase::down;
      tiles_ = gemm::RowTileScheduler(*down_, 0, 1);
    }
    tiles_.seek(phase_ == ForwardPhase::up_gate ? task : task - n_up_);
    return ForwardTask{phase_, tiles_.coord()};
  }

 private:
  gemm::RowTileScheduler tiles_;  // the current phase's tiles
  const gemm::RowTileScheduler::Params* down_;
  int n_up_ = 0;
  ForwardPhase phase_ = ForwardPhase::up_gate;
};

}  // namespace caracal::fused
