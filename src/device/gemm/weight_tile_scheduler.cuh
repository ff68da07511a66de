#pragma once
// Persistent tile scheduler of the weight gradients: per expert e, the [M][N] gradient
// dW[e] = sum over the expert's rows r of lhs[r]^T rhs[r]. Output tiles are fixed by the weight
// shapes (the host knows them); only each tile's K extent — the expert's rows, in schedule order —
// lives in device memory. Every tile reduces over all of its expert's rows itself (no split K),
// so it has one owner and a fixed K order; over a window of the schedule (a macrobatch of the
// ring) it reduces over the expert's rows there, continuing from and stopping at partial sums
// (expert_window) in the same kBlockK-row steps (the GEMM's policy's), so the windows' sums are
// bitwise the whole one.
//
// Tiles are numbered expert by expert, M block by M block, N block fastest; a CTA takes tiles
// first, first + stride, ... (standalone: blockIdx.x, gridDim.x). The CTAs working at one time are mostly on one expert and stream its rows
// in step, so each k tile of the operands comes from DRAM once and from L2 after that.
#include <climits>
#include <cstdint>

#include "caracal/schedule_view.hpp"
#include "device/gemm/gemm_config.cuh"
#include "device/gemm/gemm_policy.cuh"
#include "device/gemm/tile_coord.cuh"

namespace caracal::gemm {

// Expert `expert`'s real rows (its whole padded segment when counts are not given, never past its
// segment or the schedule's capacity whatever the offsets and counts say) against the schedule's
// window [first_row, end_row) (ScheduleView): which of them the window's tiles reduce over, and
// whether the sum goes on outside it.
struct ExpertWindow {
  int begin;        // its first row in the window (a schedule row)
  int end;          // one past its last (begin >= end: none)
  bool continues;   // it has rows before the window: the sum goes on from the partial stored then
  bool stops;       // it has rows past the window: the sum stops at a partial
  bool zero;        // it has no rows at all and the window starts the schedule: its gradient is 0
  __device__ bool has_rows() const { return begin < end; }
  __device__ bool has_tiles() const { return has_rows() || zero; }
};

__device__ inline ExpertWindow expert_window(ScheduleView const& s, int expert) {
  int const begin = __ldg(s.expert_offset + expert);
  int const segment = min(__ldg(s.expert_offset + expert + 1), s.row_capacity) - begin;
  int const counted = s.expert_count != nullptr ? __ldg(s.expert_count + expert) : segment;
  int const rows = begin >= 0 ? max(min(counted, segment), 0) : 0;
  int const window_end = s.end_row > 0 ? s.end_row : INT_MAX;
  ExpertWindow w;
  w.begin = max(begin, s.first_row);
  w.end = min(begin + rows, window_end);
  w.continues = rows > 0 && begin < s.first_row;
  w.stops = rows > 0 && begin + rows > window_end;
  w.zero = rows == 0 && s.first_row == 0;
  return w;
}

// The weight tiles of one launch (WeightTileScheduler's and WeightTilePairScheduler's Params).
struct WeightTileParams {
  ScheduleView schedule;  // each expert's rows: the K of its tiles; the window and the ring
  int m_blocks;           // ceil(M / kBlockM), M = rows of one expert's gradient
  int n_blocks;           // ceil(N / kBlockN)
  int grad_rows;          // M
};

class WeightTileScheduler {
 public:
  using Params = WeightTileParams;
  // The tile and the k steps it hands out: those of the weight-gradient GEMMs' policy
  // (src/gemm/weight_grad_kernels.cuh checks the pairing).
  using Policy = Bf16GemmPolicy;
  static_assert(kBlockM % Policy::kBlockK == 0, "the k steps of a window's rows start at a row block");

  static int64_t max_tiles(Params const& p) {
    return int64_t(p.schedule.num_experts) * p.m_blocks * p.n_blocks;
  }

  __device__ WeightTileScheduler(Params const& p, int first_tile, int tile_stride)
      : schedule_(p.schedule),
        m_blocks_(p.m_blocks),
        n_blocks_(p.n_blocks),
        grad_rows_(p.grad_rows),
        num_tiles_(p.schedule.num_experts * p.m_blocks * p.n_blocks),
        tile_(first_tile),
        stride_(tile_stride) {
    skip_tiles_without_work();
  }

  __device__ bool has_tile() const { return tile_ < num_tiles_; }
  __device__ void advance() {
    tile_ += stride_;
    skip_tiles_without_work();
  }

  __device__ static void locate(Params const&, TileCoord&) {}  // m_buffer = m_begin: gradient rows

  // The current tile's expert against the window: where its sum starts and stops.
  __device__ ExpertWindow const& window() const { return window_; }

  __device__ TileCoord coord() const { return coord_in<Policy>(); }

 protected:  // WeightTileSchedulerFor hands out another policy's tiles over the same walk
  // The current tile in policy P's tiles and kBlockK-row steps.
  template <class P>
  __device__ TileCoord coord_in() const {
    int const per_expert = m_blocks_ * n_blocks_;
    int const local = tile_ - expert_ * per_expert;
    TileCoord c;
    c.expert = expert_;
    c.m_begin = (local / n_blocks_) * P::kBlockM;
    c.m_buffer = c.m_begin;
    c.n_begin = (local % n_blocks_) * P::kBlockN;
    // The window's rows of the expert in kBlockK-row steps from its first one there: the steps of
    // the whole sum, since windows and segments start at multiples of 128.
    c.k_begin = window_.has_rows() ? schedule_.buffer_row(window_.begin) : 0;
    c.k_tiles = window_.has_rows() ? (window_.end - window_.begin + P::kBlockK - 1) / P::kBlockK : 0;
    c.active_end = c.k_tiles > 0 ? min(c.m_begin + P::kBlockM, grad_rows_) : c.m_begin;
    return c;
  }

  // Moves tile_ past the tiles of experts with nothing to do in this window (rows elsewhere only).
  __device__ void skip_tiles_without_work() {
    int const per_expert = m_blocks_ * n_blocks_;
    while (tile_ < num_tiles_) {
      int const expert = tile_ / per_expert;
      if (expert != expert_) {
        expert_ = expert;
        window_ = expert_window(schedule_, expert);
      }
      if (window_.has_tiles()) return;
      tile_ += (per_expert - tile_ % per_expert + stride_ - 1) / stride_ * stride_;  // first of the next expert's
    }
  }

  ScheduleView schedule_;
  int m_blocks_;
  int n_blocks_;
  int grad_rows_;
  int num_tiles_;
  int tile_;
  int stride_;
  int expert_ = -1;
  ExpertWindow window_{};
};

// The same walk over the tiles of another weight-gradient policy (the FP8 one: 128 x 128 tiles,
// 128-row k steps): the tile numbering and the windows are policy-free, the M and N blocks the
// launch's (Params::m_blocks, n_blocks).
template <class Policy_>
class WeightTileSchedulerFor : public WeightTileScheduler {
 public:
  using Policy = Policy_;
  static_assert(kBlockM % Policy::kBlockK == 0, "the k steps of a window's rows start at a row block");
  using WeightTileScheduler::WeightTileScheduler;

  __device__ TileCoord coord() const { return coord_in<Policy>(); }
};

}  // namespace caracal::gemm
