#pragma once
// Row tiles in pairs, for the kernels whose CTAs run as clusters of two (paired_gemm_kernel.cuh):
// the two CTAs of a cluster take one pair of tiles at a time, and the operand the two tiles share is
// read from L2 once, by a TMA multicast into both CTAs:
//   - M blocks 2j and 2j + 1 of one expert at one N block share the weights (B);
//   - an expert's last M block, when it has an odd number of them, is paired across N blocks 2i
//     and 2i + 1 and shares the rows (A); with an odd number of N blocks its last pair has no
//     second tile (the follower CTA walks the stages without computing or storing).
// Each tile of a pair is the tile RowTileScheduler would compute (same rows, K order and epilogue):
// results do not depend on the pairing or the grid.
#include <climits>
#include <cstdint>

#include "device/gemm/gemm_config.cuh"
#include "device/gemm/raster_order.hpp"
#include "device/gemm/row_tile_scheduler.cuh"
#include "device/gemm/tile_coord.cuh"

namespace caracal::gemm {

// The two tiles of a pair, as the leader's producer needs them (the consumers take one).
struct TilePair {
  TileCoord first;   // the leader's tile
  bool shares_rows;  // true: one M block at N blocks n, n + 1 (A shared); false: M blocks m, m + 1
                     // at one N block (B shared)
  bool has_second;   // the follower has a tile (false: it walks the stages only)

  // The follower's tile (when !has_second, a copy of the leader's: loaded, never computed); its
  // m_buffer is m_begin until located.
  __device__ TileCoord second() const {
    TileCoord c = first;
    if (has_second) {
      if (shares_rows) {
        c.n_begin += kBlockN;
      } else {
        c.m_begin += kBlockM;
        c.m_buffer = c.m_begin;
      }
    }
    return c;
  }
};

// Pairs are numbered expert by expert; in an expert, in raster_order.hpp's pair_position order
// (host-tested): its M-block pairs first (groups of kRasterGroupBlocks / 2 pairs, N block by N
// block, pairs fastest), then its odd block's pairs. A cluster takes pairs first, first + stride,
// ... (the standalone kernel: first = the cluster's index, stride = the clusters), or from a tile
// queue (tile_queue.cuh) whose indices count pairs. Every role of both CTAs runs its own copy; pair
// indices only grow, so the owning expert is found by moving a cursor forward. The pairs' total is
// summed over the experts once, at construction.
class RowTilePairScheduler {
 public:
  using Params = RowTileScheduler::Params;
  static constexpr bool kRunsAsPairs = true;  // paired_gemm_kernel.cuh

  // Grid sizing: never more pairs than tiles.
  static int64_t max_tiles(Params const& p) { return RowTileScheduler::max_tiles(p); }

  __device__ RowTilePairScheduler(Params const& p, int first_pair, int pair_stride)
      : offsets_(p.schedule.expert_offset),
        counts_(p.schedule.expert_count),
        num_experts_(p.schedule.num_experts),
        n_blocks_(p.n_blocks),
        k_tiles_(p.k_tiles),
        pair_(first_pair),
        stride_(pair_stride) {
    int const total_blocks = min(__ldg(offsets_ + num_experts_) / kBlockM, p.schedule.row_capacity / kBlockM);
    window_begin_ = p.schedule.first_row / kBlockM;
    window_end_ = min(total_blocks, p.schedule.end_row > 0 ? p.schedule.end_row / kBlockM : INT_MAX);
    num_pairs_ = 0;
    for (int e = 0; e < num_experts_; ++e) {
      num_pairs_ += expert_pairs(clip(__ldg(offsets_ + e) / kBlockM), clip(__ldg(offsets_ + e + 1) / kBlockM));
    }
    enter_expert(0, 0);
  }

  __device__ bool has_tile() const { return pair_ < num_pairs_; }
  __device__ void advance() { pair_ += stride_; }
  __device__ void seek(int pair) { pair_ = pair; }        // any pair at or past the current one
  __device__ int num_tiles() const { return num_pairs_; }  // pairs of this launch (the queue's count)

  __device__ static void locate(Params const& p, TileCoord& c) { RowTileScheduler::locate(p, c); }

  // The current pair (has_tile() must hold); m_buffers are m_begin until locate().
  __device__ TilePair pair() {
    while (pair_ >= pairs_end_ && expert_ + 1 < num_experts_) enter_expert(expert_ + 1, pairs_end_);
    PairPosition const pos =
        pair_position(pair_ - pairs_begin_, end_block_ - begin_block_, n_blocks_, kRasterGroupBlocks);
    TilePair t;
    t.shares_rows = pos.shares_rows;
    t.has_second = pos.has_second;
    TileCoord& c = t.first;
    c.expert = expert_;
    c.m_begin = (begin_block_ + pos.m_block) * kBlockM;
    c.m_buffer = c.m_begin;
    c.n_begin = pos.n_block * kBlockN;
    c.k_begin = 0;
    c.k_tiles = k_tiles_;
    c.active_end = counts_ != nullptr ? expert_begin_ * kBlockM + __ldg(counts_ + expert_) : end_block_ * kBlockM;
    return t;
  }

 private:
  __device__ int clip(int block) const { return min(max(block, window_begin_), window_end_); }

  // Pairs of an expert whose window blocks are [begin, end).
  __device__ int expert_pairs(int begin, int end) const { return gemm::expert_pairs(end - begin, n_blocks_); }

  __device__ void enter_expert(int e, int pairs_begin) {
    expert_ = e;
    expert_begin_ = __ldg(offsets_ + e) / kBlockM;
    begin_block_ = clip(expert_begin_);
    end_block_ = clip(__ldg(offsets_ + e + 1) / kBlockM);
    pairs_begin_ = pairs_begin;
    pairs_end_ = pairs_begin + expert_pairs(begin_block_, end_block_);
  }

  const int32_t* offsets_;
  const int32_t* counts_;
  int num_experts_;
  int n_blocks_;
  int k_tiles_;
  int pair_;
  int stride_;
  int num_pairs_;
  int window_begin_, window_end_;  // the row blocks this scheduler's tiles cover
  int expert_;
  int expert_begin_;           // first M block of expert_ (unclipped: its rows' counts start there)
  int begin_block_, end_block_;  // its blocks in the window
  int pairs_begin_, pairs_end_;  // its pairs
};

}  // namespace caracal::gemm
