#pragma once
// The fused forward's compute tasks (DESIGN §3) of one rank, in one order: the shared expert's
// up/gate+SwiGLU tiles, its down tiles (they need no pulled rows: they fill the SMs while the first
// pulls are in flight), then, macrobatch by macrobatch in descending order, the routed experts'
// up/gate+SwiGLU tiles, their down tiles (each phase in RowTileScheduler's order) and the group
// sums of the macrobatch's 128-row blocks (forward_group_sums.cuh: combine's expert side, before
// the next macrobatch's down tiles overwrite the output rows they read; none for macrobatch 0,
// walked last, whose rows the combine launch sums). The rank's compute CTAs
// take tasks in that order from one counter (atomicAdd), so a CTA that finishes early, or a comm
// CTA whose pulls are done, takes the next. Each task waits only on counters raised by the comm
// CTAs (x rows pulled) or by tasks of lower index (an M block's activation complete, the ring rows
// it takes over released by the macrobatch walked before, a block's output rows stored, a
// macrobatch's group sums done); the comm CTAs' pulls into the ring wait only on tasks of lower
// index than those reading them. Each CTA takes tasks in increasing order (at most one ahead of the
// one it runs, forward_task_handoff.cuh), only running CTAs take them, and every CTA of the launch
// becomes resident (the grid fits the device; the launch may start beside the schedule's CTAs, and
// its last CTAs land as those exit, which wait on nothing of this launch), so the smallest
// unfinished task can always run (its CTA's task before it is smaller, hence done): no deadlock. Which CTA runs a task
// changes nothing in its result (one CTA per tile, K in a fixed order; one warp per group sum).
// Host code walks the same cursor (tests/unit/test_task_order.cpp checks the order and that rule).
#include <climits>

#include "caracal/schedule_view.hpp"
#include "device/common/host_device.hpp"
#include "device/gemm/row_tile_scheduler.cuh"
#include "device/gemm/tile_coord.cuh"

namespace caracal::fused {

// In task order; end: no more tasks for this CTA.
enum class ForwardPhase : int { shared_up_gate, shared_down, up_gate, down, group_sums, end };

struct ForwardTask {
  ForwardPhase phase;
  gemm::TileCoord tile;
  CARACAL_HOST_DEVICE int m_block() const { return tile.m_begin / gemm::kBlockM; }
  CARACAL_HOST_DEVICE bool up_gate() const {
    return phase == ForwardPhase::up_gate || phase == ForwardPhase::shared_up_gate;
  }
  CARACAL_HOST_DEVICE bool shared() const {
    return phase == ForwardPhase::shared_up_gate || phase == ForwardPhase::shared_down;
  }
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
  ForwardTask task;  // 32 bytes a slot
};
static_assert(sizeof(TaskSlot) == 32);

// The routed experts' schedule rows cut into macrobatches (DESIGN §3) of ring_blocks 128-row
// blocks, the rows the ring holds (the whole schedule in one when there is no ring). The forward
// walks them in descending order, so that macrobatch 0 is what the ring holds at the end. Block s
// of macrobatch m sits in the ring where block s + ring_blocks of macrobatch m + 1 sat before it.
struct Macrobatches {
  int total_blocks = 0;  // row blocks of the schedule
  int ring_blocks = 1;   // row blocks of a macrobatch (the last may hold fewer)

  Macrobatches() = default;
  CARACAL_HOST_DEVICE explicit Macrobatches(const ScheduleView& rows)
      : total_blocks(min(rows.expert_offset[rows.num_experts], rows.row_capacity) / gemm::kBlockM),
        ring_blocks(rows.ring_rows > 0 ? rows.ring_rows / gemm::kBlockM : max(total_blocks, 1)) {}

  CARACAL_HOST_DEVICE int count() const { return (total_blocks + ring_blocks - 1) / ring_blocks; }
  CARACAL_HOST_DEVICE int of_block(int block) const { return block / ring_blocks; }
  // The row blocks of macrobatch `batch`.
  CARACAL_HOST_DEVICE int blocks_in(int batch) const {
    return min(total_blocks, (batch + 1) * ring_blocks) - batch * ring_blocks;
  }
  // The block whose ring rows block `block` takes over (walked before it), or -1 for none.
  CARACAL_HOST_DEVICE int previous_in_ring(int block) const {
    return block + ring_blocks < total_blocks ? block + ring_blocks : -1;
  }
  // Whether block `block`'s output rows are summed inside the launch (a group_sums task reads them
  // once out_stored says so): those of every macrobatch but 0, which the combine launch after the
  // kernel sums. Static: it needs only the ring's size.
  CARACAL_HOST_DEVICE static bool summed_in_launch(const ScheduleView& rows, int block) {
    return rows.ring_rows > 0 && block >= rows.ring_rows / gemm::kBlockM;
  }
};

// Maps task indices, given in increasing order, to tiles (each role of a CTA keeps its own): the
// shared expert's up/gate then down tiles, then per macrobatch (descending) the routed up/gate
// tiles, the down tiles and, but for macrobatch 0, the group sums of its blocks (a group_sums
// task: its block's first row in tile.m_begin, its macrobatch in tile.expert and the
// macrobatch's rows in [tile.k_begin, tile.active_end)). Macrobatch 0's rows stay in the ring
// after the launch: TokenExchange::combine_after_fused_forward sums them on every SM. The phases
// are named, not indexed, so that everything stays in registers.
//
// The shared expert's tasks need no schedule, so the launch may start while the schedule is still
// being built (fused_forward.hpp): the routed tasks are counted only once a task past the shared
// expert's is taken, after the wait for the schedule's launch. `Loads`: how the tiles read the
// schedules' offsets and counts (row_tile_scheduler.cuh).
template <class Loads = gemm::ReadOnlyLoads>
class ForwardTaskCursorOf {
 public:
  // `shared` (null without a shared expert) and `routed` must outlive the cursor (kernel
  // parameters do).
  CARACAL_HOST_DEVICE ForwardTaskCursorOf(const ExpertTiles* shared, const ExpertTiles& routed)
      : shared_(shared), routed_(&routed) {
    const int shared_up = shared != nullptr ? Tiles(shared->up, 0, 1).num_tiles() : 0;
    end_shared_up_ = shared_up;
    end_shared_down_ = end_shared_up_ + (shared != nullptr ? down_tasks(*shared, shared_up / shared->up.n_blocks) : 0);
  }

  // The shared expert's tasks, the first ones.
  CARACAL_HOST_DEVICE int shared_tasks() const { return end_shared_down_; }
  CARACAL_HOST_DEVICE bool routed_counted() const { return end_ != kUncounted; }
  // Reads the routed experts' schedule (built by now) and counts their tasks.
  CARACAL_HOST_DEVICE void count_routed_tasks() {
    batches_ = Macrobatches(routed_->up.schedule);
    const int batches = batches_.count();
    end_ = end_shared_down_ + batches_.total_blocks * per_block() - (batches > 0 ? batches_.blocks_in(0) : 0);
  }

  // Every task, once counted (count_routed_tasks); until then more than any task index.
  CARACAL_HOST_DEVICE int num_tasks() const { return end_; }
  CARACAL_HOST_DEVICE const Macrobatches& macrobatches() const { return batches_; }

  // Task `task` (in [0, num_tasks()), at or past the last one asked for).
  CARACAL_HOST_DEVICE ForwardTask at(int task) { return find(task, /*jump=*/false); }
  // Task `task` (in [0, num_tasks())), in any order: the phase's tiles set afresh and its tile's
  // expert found by bisection (RowTileScheduler::jump), for a thread that resolves a few tasks
  // anywhere in the order (forward_task_table.cuh). The same task as at().
  CARACAL_HOST_DEVICE ForwardTask at_any(int task) {
    batch_ = -1;
    return find(task, /*jump=*/true);
  }

 private:
  CARACAL_HOST_DEVICE ForwardTask find(int task, bool jump) {
    ForwardPhase phase;
    int first;  // the phase's first task
    int batch = 0;
    if (task < end_shared_up_) {
      phase = ForwardPhase::shared_up_gate;
      first = 0;
    } else if (task < end_shared_down_) {
      phase = ForwardPhase::shared_down;
      first = end_shared_up_;
    } else {
      const int routed = task - end_shared_down_;
      const int batches = batches_.count();
      // The routed tasks of the macrobatch walked first, and of each of the others (full ones).
      const int first_walked_blocks = batches > 0 ? batches_.blocks_in(batches - 1) : 0;
      const int last_batch_tasks = first_walked_blocks * per_block() - (batches == 1 ? first_walked_blocks : 0);
      const int full_batch_tasks = batches_.ring_blocks * per_block();
      const int walked = routed < last_batch_tasks ? 0 : 1 + (routed - last_batch_tasks) / full_batch_tasks;
      batch = batches - 1 - walked;
      first = end_shared_down_ + (walked == 0 ? 0 : last_batch_tasks + (walked - 1) * full_batch_tasks);
      const int blocks = batches_.blocks_in(batch);
      const int up_tasks = blocks * routed_->up.n_blocks;
      const int down_tasks = blocks * routed_->down.n_blocks;
      if (task - first >= up_tasks + down_tasks) {
        gemm::TileCoord tile{};
        tile.m_begin = (batch * batches_.ring_blocks + task - first - up_tasks - down_tasks) * gemm::kBlockM;
        tile.k_tiles = 1;  // the stage that hands it to the consumers
        tile.expert = batch;
        tile.k_begin = batch * batches_.ring_blocks * gemm::kBlockM;
        tile.active_end = (batch * batches_.ring_blocks + blocks) * gemm::kBlockM;
        return ForwardTask{ForwardPhase::group_sums, tile};
      }
      phase = task - first < up_tasks ? ForwardPhase::up_gate : ForwardPhase::down;
      if (phase == ForwardPhase::down) first += up_tasks;
    }
    if (phase != phase_ || batch != batch_) {
      phase_ = phase;
      batch_ = batch;
      const int begin = batch * batches_.ring_blocks, end = begin + batches_.ring_blocks;
      switch (phase) {
        case ForwardPhase::shared_up_gate: tiles_ = Tiles(shared_->up, 0, 1); break;
        case ForwardPhase::shared_down: tiles_ = Tiles(shared_->down, 0, 1); break;
        case ForwardPhase::up_gate: tiles_ = Tiles(routed_->up, 0, 1, begin, end); break;
        default: tiles_ = Tiles(routed_->down, 0, 1, begin, end); break;
      }
    }
    if (jump) {
      tiles_.jump(task - first);
    } else {
      tiles_.seek(task - first);
    }
    gemm::TileCoord tile = tiles_.coord();
    if (phase == ForwardPhase::up_gate || phase == ForwardPhase::down) Tiles::locate(routed_->up, tile);
    return ForwardTask{phase, tile};
  }

  // A routed block's tasks: its tiles and, but in macrobatch 0 (walked last: combine sums it), its
  // group sums. From the kernel parameters: no register held.
  CARACAL_HOST_DEVICE int per_block() const { return routed_->up.n_blocks + routed_->down.n_blocks + 1; }
  // A group's down tiles over `blocks` row blocks.
  CARACAL_HOST_DEVICE static int down_tasks(const ExpertTiles& t, int blocks) { return blocks * t.down.n_blocks; }

  using Tiles = gemm::RowTileSchedulerOf<gemm::kBlockN, Loads>;
  static constexpr int kUncounted = INT_MAX;

  const ExpertTiles* shared_;
  const ExpertTiles* routed_;
  Macrobatches batches_;
  Tiles tiles_;  // the current phase's tiles: set by the first at() (batch_ = -1)
  int end_shared_up_, end_shared_down_;  // one past each group's last task
  int end_ = kUncounted;                 // one past the last task
  ForwardPhase phase_ = ForwardPhase::up_gate;
  int batch_ = -1;  // no macrobatch yet
};

using ForwardTaskCursor = ForwardTaskCursorOf<>;

// A CTA's producer scratch, in global memory after its rank's task slots (forward_params.cuh): the
// task cursor, and the task thread 0 hands the other producer threads each round, in two buffers by
// the round's parity (a buffer is rewritten two rounds on, after every thread has met thread 0 in
// between), with the block whose ring rows the task takes over (forward_task_handoff.cuh walks it).
struct ProducerScratch {
  ForwardTaskCursor cursor;
  ForwardTask task[2];
  int previous[2];
};

}  // namespace caracal::fused
