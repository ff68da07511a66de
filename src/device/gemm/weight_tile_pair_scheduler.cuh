#pragma once
// The weight gradients' tiles in pairs, for the CTA-pair kernel (paired_gemm_kernel.cuh): M blocks
// 2j and 2j + 1 of one expert's gradient at one N block share the N operand (the rows' N columns,
// 32 KiB a k tile), read from L2 once by a TMA multicast into both CTAs; with an odd number of M
// blocks the last pair has no second tile (the follower walks the stages without computing or
// storing). Each tile is the one WeightTileScheduler would compute (same rows, K order, window and
// epilogue): results do not depend on the pairing or the grid.
//
// Pairs are numbered expert by expert, in raster_order.hpp's weight_pair_position order (host-tested:
// M-block pair by M-block pair, N block fastest); a cluster takes pairs first, first + stride, ...
// (no tile queue), experts with nothing to do in the window skipped.
#include <climits>
#include <cstdint>

#include "caracal/schedule_view.hpp"
#include "device/gemm/gemm_config.cuh"
#include "device/gemm/raster_order.hpp"
#include "device/gemm/row_tile_pair_scheduler.cuh"
#include "device/gemm/tile_coord.cuh"
#include "device/gemm/weight_tile_scheduler.cuh"

namespace caracal::gemm {

class WeightTilePairScheduler {
 public:
  using Params = WeightTileParams;
  using Policy = WeightTileScheduler::Policy;  // the tiles and k steps WeightTileScheduler hands out
  static constexpr bool kRunsAsPairs = true;

  // Grid sizing: never more CTAs than tiles.
  static int64_t max_tiles(Params const& p) { return WeightTileScheduler::max_tiles(p); }

  __device__ WeightTilePairScheduler(Params const& p, int first_pair, int pair_stride)
      : schedule_(p.schedule),
        m_blocks_(p.m_blocks),
        n_blocks_(p.n_blocks),
        grad_rows_(p.grad_rows),
        pairs_per_expert_(weight_expert_pairs(p.m_blocks, p.n_blocks)),
        num_pairs_(p.schedule.num_experts * pairs_per_expert_),
        pair_(first_pair),
        stride_(pair_stride) {
    skip_pairs_without_work();
  }

  __device__ bool has_tile() const { return pair_ < num_pairs_; }
  __device__ void advance() {
    pair_ += stride_;
    skip_pairs_without_work();
  }

  __device__ static void locate(Params const&, TileCoord&) {}  // m_buffer = m_begin: gradient rows

  // The current pair's expert against the window: where its sum starts and stops.
  __device__ ExpertWindow const& window() const { return window_; }

  // The current pair (has_tile() must hold). active_end is the gradient's rows when the window
  // has rows of the expert (else 0: both tiles store zeros or nothing), so that it holds for the
  // second tile too (TilePair::second() copies it).
  __device__ TilePair pair() const {
    PairPosition const pos = weight_pair_position(pair_ - expert_ * pairs_per_expert_, m_blocks_, n_blocks_);
    TilePair t;
    t.shares_rows = pos.shares_rows;  // false: the two M blocks share the N operand
    t.has_second = pos.has_second;
    TileCoord& c = t.first;
    c.expert = expert_;
    c.m_begin = pos.m_block * Policy::kBlockM;
    c.m_buffer = c.m_begin;
    c.n_begin = pos.n_block * Policy::kBlockN;
    // The window's rows of the expert in kBlockK-row steps from its first one there, as
    // WeightTileScheduler.
    c.k_begin = window_.has_rows() ? schedule_.buffer_row(window_.begin) : 0;
    c.k_tiles = window_.has_rows() ? (window_.end - window_.begin + Policy::kBlockK - 1) / Policy::kBlockK : 0;
    c.active_end = c.k_tiles > 0 ? grad_rows_ : 0;
    return t;
  }

 private:
  // Moves pair_ past the pairs of experts with nothing to do in this window.
  __device__ void skip_pairs_without_work() {
    while (pair_ < num_pairs_) {
      int const expert = pair_ / pairs_per_expert_;
      if (expert != expert_) {
        expert_ = expert;
        window_ = expert_window(schedule_, expert);
      }
      if (window_.has_tiles()) return;
      pair_ += (pairs_per_expert_ - pair_ % pairs_per_expert_ + stride_ - 1) / stride_ * stride_;
    }
  }

  ScheduleView schedule_;
  int m_blocks_;
  int n_blocks_;
  int grad_rows_;
  int pairs_per_expert_;
  int num_pairs_;
  int pair_;
  int stride_;
  int expert_ = -1;
  ExpertWindow window_{};
};

}  // namespace caracal::gemm
