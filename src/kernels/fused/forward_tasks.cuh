#pragma once
// The fused forward's compute tasks (DESIGN §3) of one rank, in one order of four phases: the
// shared expert's up/gate+SwiGLU tiles, its down tiles (they need no pulled rows: they fill the SMs
// while the first pulls are in flight), then the routed experts' up/gate+SwiGLU tiles and their
// down tiles, each phase in RowTileScheduler's order. The rank's compute CTAs take tasks in that
// order from one counter (atomicAdd), so a CTA that finishes early, or a comm CTA whose pulls are
// done, takes the next. Each task waits only on counters raised by the comm CTAs (x rows pulled) or
// by tasks of lower index (an M block's activation complete); tasks are taken in increasing order
// and every CTA of the launch is resident, so the smallest unfinished task can always run: no
// deadlock. Which CTA runs a task changes nothing in its result (one CTA per tile, K in a fixed
// order).
#include "device/gemm/row_tile_scheduler.cuh"
#include "device/gemm/tile_coord.cuh"

namespace caracal::fused {

// In task order; end: no more tasks for this CTA.
enum class ForwardPhase : int { shared_up_gate, shared_down, up_gate, down, end };

struct ForwardTask {
  ForwardPhase phase;
  gemm::TileCoord tile;
  __device__ int m_block() const { return tile.m_begin / gemm::kBlockM; }
  __device__ bool up_gate() const { return phase == ForwardPhase::up_gate || phase == ForwardPhase::shared_up_gate; }
  __device__ bool shared() const { return phase == ForwardPhase::shared_up_gate || phase == ForwardPhase::shared_down; }
};

// One group of experts' two GEMMs' tiles: both over the same row blocks.
struct ExpertTiles {
  gemm::RowTileScheduler::Params up;
  gemm::RowTileScheduler::Params down;
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

// Maps task indices, given in increasing order, to tiles (each role of a CTA keeps its own). The
// phases are named, not indexed, so that everything stays in registers.
class ForwardTaskCursor {
 public:
  // `shared` (null without a shared expert) and `routed` must outlive the cursor (kernel
  // parameters do).
  __device__ ForwardTaskCursor(const ExpertTiles* shared, const ExpertTiles& routed)
      : shared_(shared), routed_(&routed), tiles_(routed.up, 0, 1) {
    const int shared_up = shared != nullptr ? gemm::RowTileScheduler(shared->up, 0, 1).num_tiles() : 0;
    end_shared_up_ = shared_up;
    end_shared_down_ = end_shared_up_ + (shared != nullptr ? down_tasks(*shared, shared_up) : 0);
    end_up_ = end_shared_down_ + tiles_.num_tiles();
    end_down_ = end_up_ + down_tasks(routed, tiles_.num_tiles());
  }

  __device__ int num_tasks() const { return end_down_; }

  // Task `task` (in [0, num_tasks()), at or past the last one asked for).
  __device__ ForwardTask at(int task) {
    const ForwardPhase phase = task < end_shared_up_     ? ForwardPhase::shared_up_gate
                               : task < end_shared_down_ ? ForwardPhase::shared_down
                               : task < end_up_          ? ForwardPhase::up_gate
                                                         : ForwardPhase::down;
    if (phase != phase_) {
      phase_ = phase;
      switch (phase) {
        case ForwardPhase::shared_up_gate: tiles_ = gemm::RowTileScheduler(shared_->up, 0, 1); break;
        case ForwardPhase::shared_down: tiles_ = gemm::RowTileScheduler(shared_->down, 0, 1); break;
        case ForwardPhase::up_gate: tiles_ = gemm::RowTileScheduler(routed_->up, 0, 1); break;
        default: tiles_ = gemm::RowTileScheduler(routed_->down, 0, 1); break;
      }
    }
    const int first = phase == ForwardPhase::shared_up_gate ? 0
                      : phase == ForwardPhase::shared_down  ? end_shared_up_
                      : phase == ForwardPhase::up_gate      ? end_shared_down_
                                                            : end_up_;
    tiles_.seek(task - first);
    return ForwardTask{phase, tiles_.coord()};
  }

 private:
  // A group's down tiles: as many row blocks as its up/gate tiles, times the down GEMM's N blocks.
  __device__ static int down_tasks(const ExpertTiles& t, int up_tasks) { return up_tasks / t.up.n_blocks * t.down.n_blocks; }

  const ExpertTiles* shared_;
  const ExpertTiles* routed_;
  gemm::RowTileScheduler tiles_;  // the current phase's tiles
  int end_shared_up_, end_shared_down_, end_up_, end_down_;  // one past each phase's last task
  ForwardPhase phase_ = ForwardPhase::up_gate;  // tiles_ starts on the routed up/gate tiles
};

}  // namespace caracal::fused
