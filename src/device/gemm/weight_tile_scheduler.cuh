#pragma once
// Persistent tile scheduler of the weight gradients: per expert e, the [M][N] gradient
// dW[e] = sum over the expert's rows r of lhs[r]^T rhs[r]. Output tiles are fixed by the weight
// shapes (the host knows them); only each tile's K extent — the expert's rows, in schedule order —
// lives in device memory. Every tile reduces over all of its expert's rows itself (no split K),
// so it has one owner and a fixed K order.
//
// Tiles are numbered expert by expert, M block by M block, N block fastest; a CTA takes tiles
// first, first + stride, ... (standalone: blockIdx.x, gridDim.x). The CTAs working at one time are mostly on one expert and stream its rows
// in step, so each k tile of the operands comes from DRAM once and from L2 after that.
#include <cstdint>

#include "caracal/schedule_view.hpp"
#include "device/gemm/gemm_config.cuh"
#include "device/gemm/tile_coord.cuh"

namespace caracal::gemm {

class WeightTileScheduler {
 public:
  struct Params {
    ScheduleView schedule;  // each expert's rows: the K of its tiles (ring_rows 0)
    int m_blocks;           // ceil(M / kBlockM), M = rows of one expert's gradient
    int n_blocks;           // ceil(N / kBlockN)
    int grad_rows;          // M
  };

  static int64_t max_tiles(Params const& p) {
    return int64_t(p.schedule.num_experts) * p.m_blocks * p.n_blocks;
  }

  __device__ WeightTileScheduler(Params const& p, int first_tile, int tile_stride)
      : offsets_(p.schedule.expert_offset),
        counts_(p.schedule.expert_count),
        m_blocks_(p.m_blocks),
        n_blocks_(p.n_blocks),
        grad_rows_(p.grad_rows),
        capacity_(p.schedule.row_capacity),
        num_tiles_(p.schedule.num_experts * p.m_blocks * p.n_blocks),
        tile_(first_tile),
        stride_(tile_stride) {}

  __device__ bool has_tile() const { return tile_ < num_tiles_; }
  __device__ void advance() { tile_ += stride_; }

  __device__ TileCoord coord() const {
    int const per_expert = m_blocks_ * n_blocks_;
    int const expert = tile_ / per_expert;
    int const local = tile_ - expert * per_expert;
    int const begin = __ldg(offsets_ + expert);
    // The expert's real rows (its whole padded segment when counts are not given), never past
    // its segment or the row buffers whatever the offsets and counts say.
    int const segment = min(__ldg(offsets_ + expert + 1), capacity_) - begin;
    int const rows = min(counts_ != nullptr ? __ldg(counts_ + expert) : segment, segment);
    TileCoord c;
    c.expert = expert;
    c.m_begin = (local / n_blocks_) * kBlockM;
    c.n_begin = (local % n_blocks_) * kBlockN;
    c.k_begin = begin;
    c.k_tiles = begin >= 0 && rows > 0 ? (rows + kBlockK - 1) / kBlockK : 0;
    c.active_end = c.k_tiles > 0 ? min(c.m_begin + kBlockM, grad_rows_) : c.m_begin;
    return c;
  }

 private:
  const int32_t* offsets_;
  const int32_t* counts_;
  int m_blocks_;
  int n_blocks_;
  int grad_rows_;
  int capacity_;
  int num_tiles_;
  int tile_;
  int stride_;
};

}  // namespace caracal::gemm
