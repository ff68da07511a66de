#pragma once
// Persistent tile scheduler over expert-contiguous rows whose offsets live in device memory: the
// tiles of the GEMMs whose M is the rows (forward, backward dgrad).
//
// Every 128-row M block belongs to exactly one expert (segments are padded to the M tile), so the
// grouped GEMM is one GEMM over all row blocks in which each block uses its expert's weights.
// Tiles are numbered expert by expert: expert e owns tiles [B_e * nb, B_{e+1} * nb) where
// B_e = expert_offset[e] / 128 and nb is the number of N blocks; inside an expert, in the order of
// raster_order.hpp (groups of kRasterGroupBlocks M blocks, N block by N block).
//
// A CTA takes tiles first, first + stride, ... while they are below the device-side total (the
// standalone kernel: first = blockIdx.x, stride = gridDim.x), or, with a tile queue
// (tile_queue.cuh), whichever tile comes next when it is free. Each role
// (producer, consumers) runs its own copy and walks the same sequence; tile indices only grow, so
// the owning expert is found by moving a cursor forward (amortised O(1) per tile). Host code runs
// it too, over a schedule in host memory (the fused kernels' task orders, tests/unit).
#include <climits>
#include <cstdint>

#include "caracal/schedule_view.hpp"
#include "device/common/host_device.hpp"
#include "device/gemm/raster_order.hpp"
#include "device/gemm/tile_coord.cuh"
#include "device/gemm/tile_shape.hpp"

namespace caracal::gemm {

struct RowTileParams {
  ScheduleView schedule;  // the rows' grouping by expert, its window and its ring
  int n_blocks;           // ceil(N / the tile's N)
  int k_tiles;            // K / the policy's kBlockK
  uint32_t* tile_queue;   // nullptr: each CTA takes tiles first, first + stride, ...; else they
                          // are handed out in order from it (tile_queue.cuh)
};

// How a scheduler reads the schedule's offsets and counts: the GEMM kernels through the read-only
// data cache; a launch that copied them into shared memory first with plain loads, which take
// shared and global addresses alike (forward_task_table.cu).
struct ReadOnlyLoads {
  CARACAL_HOST_DEVICE static int32_t load(const int32_t* p) { return load_read_only(p); }
};
struct PlainLoads {
  CARACAL_HOST_DEVICE static int32_t load(const int32_t* p) { return *p; }
};

// `BlockN`: the N of the GEMM's tile (its policy's kBlockN).
template <int BlockN, class Loads = ReadOnlyLoads>
class RowTileSchedulerOf {
 public:
  using Params = RowTileParams;

  // The most tiles `p` can hold: every row block of the capacity, N block by N block.
  static int64_t max_tiles(Params const& p) {
    return int64_t(p.schedule.row_capacity / kBlockM) * p.n_blocks;
  }

  // A placeholder to assign a scheduler to before any use (for a cursor that sets it on first use).
  RowTileSchedulerOf() = default;

  // The tiles of the schedule's row blocks in its window [first_row, end_row), or, for the fused
  // kernels' macrobatches, of blocks [begin_block, end_block) only (clipped to the schedule's rows).
  CARACAL_HOST_DEVICE RowTileSchedulerOf(Params const& p, int first_tile, int tile_stride, int begin_block = 0,
                                         int end_block = INT_MAX)
      : offsets_(p.schedule.expert_offset),
        counts_(p.schedule.expert_count),
        num_experts_(p.schedule.num_experts),
        n_blocks_(p.n_blocks),
        k_tiles_(p.k_tiles),
        tile_(first_tile),
        stride_(tile_stride) {
    // Never past the row buffers, whatever the offsets say.
    int const total_blocks = min(Loads::load(offsets_ + num_experts_) / kBlockM, p.schedule.row_capacity / kBlockM);
    window_begin_ = max(begin_block, p.schedule.first_row / kBlockM);
    window_end_ = min(min(end_block, total_blocks), p.schedule.end_row > 0 ? p.schedule.end_row / kBlockM : INT_MAX);
    num_tiles_ = max(window_end_ - window_begin_, 0) * n_blocks_;
    // The expert holding the window's first block (experts before it may be empty).
    expert_begin_ = Loads::load(offsets_) / kBlockM;
    end_block_ = Loads::load(offsets_ + 1) / kBlockM;
    while (end_block_ <= window_begin_ && expert_ + 1 < num_experts_) {
      ++expert_;
      expert_begin_ = end_block_;
      end_block_ = Loads::load(offsets_ + expert_ + 1) / kBlockM;
    }
    begin_block_ = max(expert_begin_, window_begin_);
  }

  CARACAL_HOST_DEVICE bool has_tile() const { return tile_ < num_tiles_; }
  CARACAL_HOST_DEVICE void advance() { tile_ += stride_; }
  CARACAL_HOST_DEVICE int tile() const { return tile_; }            // the current tile's index
  CARACAL_HOST_DEVICE void seek(int tile) { tile_ = tile; }         // any tile at or past the current one
  // Any tile at or past the current one, its expert found by bisection over the offsets (log2 of
  // the experts' count in loads, where seek's walk takes one per expert crossed): for a thread that
  // takes one tile anywhere (the fused forward's task table). coord() then finds what a walk would.
  CARACAL_HOST_DEVICE void jump(int tile) {
    tile_ = tile;
    int const t = tile + window_begin_ * n_blocks_;  // numbered from block 0
    // The first expert from expert_ on whose blocks end past t (coord's walk stops there), else the last.
    int lo = expert_, hi = num_experts_ - 1;
    while (lo < hi) {
      int const mid = (lo + hi) / 2;
      if (Loads::load(offsets_ + mid + 1) / kBlockM * n_blocks_ > t) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    if (lo == expert_) return;
    expert_ = lo;
    expert_begin_ = begin_block_ = Loads::load(offsets_ + lo) / kBlockM;
    end_block_ = Loads::load(offsets_ + lo + 1) / kBlockM;
  }
  CARACAL_HOST_DEVICE int num_tiles() const { return num_tiles_; }  // tiles of this launch's schedule

  // Sets c.m_buffer, where c's rows lie in the row buffers (ScheduleView::buffer_row): read from
  // the parameters, not kept in the scheduler (in the fused kernel's producer every register counts).
  CARACAL_HOST_DEVICE static void locate(Params const& p, TileCoord& c) { c.m_buffer = p.schedule.buffer_row(c.m_begin); }

  // The current tile (has_tile() must hold); its m_buffer is m_begin until locate().
  CARACAL_HOST_DEVICE TileCoord coord() {
    int const t = tile_ + window_begin_ * n_blocks_;  // numbered from block 0
    while (t >= end_block_ * n_blocks_ && expert_ + 1 < num_experts_) {
      ++expert_;
      expert_begin_ = begin_block_ = end_block_;
      end_block_ = Loads::load(offsets_ + expert_ + 1) / kBlockM;
    }
    int const local = t - begin_block_ * n_blocks_;
    int const blocks = min(end_block_, window_end_) - begin_block_;
    RasterPosition const pos = raster_position(local, blocks, n_blocks_, kRasterGroupBlocks);
    TileCoord c;
    c.expert = expert_;
    c.m_begin = (begin_block_ + pos.m_block) * kBlockM;
    c.m_buffer = c.m_begin;  // over a ring: locate()
    c.n_begin = pos.n_block * BlockN;
    c.k_begin = 0;
    c.k_tiles = k_tiles_;
    // The end of the expert's real rows (its padded end when counts are not given).
    c.active_end = counts_ != nullptr ? expert_begin_ * kBlockM + Loads::load(counts_ + expert_)
                                      : end_block_ * kBlockM;
    return c;
  }

 private:
  const int32_t* offsets_;
  const int32_t* counts_;
  int num_experts_;
  int n_blocks_;
  int k_tiles_;
  int tile_;
  int stride_;
  int num_tiles_;
  int window_begin_, window_end_;  // the row blocks this scheduler's tiles cover
  int expert_ = 0;
  int expert_begin_;  // first M block of expert_
  int begin_block_;   // the first of them in the window
  int end_block_;     // one past its last
};

// The bf16 GEMMs' (Bf16GemmPolicy's N).
using RowTileScheduler = RowTileSchedulerOf<kBlockN>;

}  // namespace caracal::gemm
