#pragma once
// The order in which a row-tile GEMM visits one expert's tiles (row_tile_scheduler.cuh), and the
// CTA pairs of the row tiles and of the weight gradients, apart so that host tests can check them. The expert's M blocks are cut into groups of `group_blocks` (the
// last group holds the rest); a group's tiles go N block by N block, M blocks fastest, so the CTAs
// working at one time read a few A blocks and a few weight slabs, each from several tiles at once.
// Groups of up to 16 blocks of even widths (9 as one group, not 8 + 1) read more from DRAM and run
// slower than this order.
namespace caracal::gemm {

struct RasterPosition {
  int m_block;  // of the expert's blocks
  int n_block;
};

// Tile `local` in [0, blocks * n_blocks) of an expert with `blocks` >= 1 M blocks.
#if defined(__CUDACC__)
__host__ __device__
#endif
inline RasterPosition raster_position(int local, int blocks, int n_blocks, int group_blocks) {
  int const grouped_blocks = blocks - blocks % group_blocks;  // in full groups
  if (local < grouped_blocks * n_blocks) {
    int const group_tiles = group_blocks * n_blocks;
    int const group = local / group_tiles;
    int const r = local - group * group_tiles;
    return {group * group_blocks + r % group_blocks, r / group_blocks};
  }
  int const r = local - grouped_blocks * n_blocks;  // the last, partial group
  int const width = blocks - grouped_blocks;
  return {grouped_blocks + r % width, r / width};
}

// CTA pairs (row_tile_pair_scheduler.cuh): an expert with `blocks` M blocks is walked as pairs of
// tiles, first the M-block pairs (2j, 2j + 1) at each N block, in the order above over the blocks/2
// pairs (groups of group_blocks / 2 pairs), then, for an odd count, its last block at N blocks
// (2i, 2i + 1) — the last of those without a second tile when n_blocks is odd.
struct PairPosition {
  int m_block;       // the first tile's
  int n_block;
  bool shares_rows;  // the second tile is (m_block, n_block + 1); else (m_block + 1, n_block)
  bool has_second;
};

#if defined(__CUDACC__)
__host__ __device__
#endif
inline int expert_pairs(int blocks, int n_blocks) {
  return (blocks / 2) * n_blocks + (blocks % 2) * ((n_blocks + 1) / 2);
}

// Pair `local` in [0, expert_pairs(blocks, n_blocks)) of an expert with `blocks` >= 1 M blocks.
#if defined(__CUDACC__)
__host__ __device__
#endif
inline PairPosition pair_position(int local, int blocks, int n_blocks, int group_blocks) {
  int const m_pairs = blocks / 2;
  if (local < m_pairs * n_blocks) {
    RasterPosition const pos = raster_position(local, m_pairs, n_blocks, group_blocks > 1 ? group_blocks / 2 : 1);
    return {2 * pos.m_block, pos.n_block, false, true};
  }
  int const n_block = 2 * (local - m_pairs * n_blocks);
  return {blocks - 1, n_block, true, n_block + 1 < n_blocks};
}

// The weight gradients' CTA pairs (weight_tile_pair_scheduler.cuh): an expert's gradient of
// `m_blocks` x `n_blocks` tiles is walked as the M-block pairs (2j, 2j + 1) at each N block, N block
// fastest — the last pair without a second tile when m_blocks is odd.
#if defined(__CUDACC__)
__host__ __device__
#endif
inline int weight_expert_pairs(int m_blocks, int n_blocks) { return (m_blocks + 1) / 2 * n_blocks; }

// Pair `local` in [0, weight_expert_pairs(m_blocks, n_blocks)).
#if defined(__CUDACC__)
__host__ __device__
#endif
inline PairPosition weight_pair_position(int local, int m_blocks, int n_blocks) {
  int const m_block = 2 * (local / n_blocks);
  return {m_block, local % n_blocks, false, m_block + 1 < m_blocks};
}

}  // namespace caracal::gemm
