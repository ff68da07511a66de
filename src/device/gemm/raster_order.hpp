#pragma once
// The order in which a row-tile GEMM visits one expert's tiles (row_tile_scheduler.cuh), apart so
// that host tests can check it. The expert's M blocks are cut into groups of `group_blocks` (the
// last group holds the rest); a group's tiles go N block by N block, M blocks fastest, so the CTAs
// working at one time read a few A blocks and a few weight slabs, each from several tiles at once.
//
// Measured on the H200 (docs/PERF.md, 2026-12-01, DeepSeek-V3's up/gate, 8-9 blocks an expert):
// groups of up to 16 blocks of even widths (9 as one group, not 8 + 1) read 10.9 GB from DRAM
// against 6.8 GB for this order and ran 15% slower, with each CTA's tiles at a fixed stride.
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

}  // namespace caracal::gemm
