#pragma once
// The kinds of GEMM operand the grouped kernels stream through TMA: the copies of one k tile into
// a stage (device, the producer thread); their tensor maps are each kind's OperandMaps
// (src/gemm/operand_maps.hpp). What is loaded (element, MN rows, K depth) is the GEMM's policy's
// OperandTile (gemm_policy.cuh): Gemm::Policy::A or ::B. Every stage receives its operand tile's
// full byte count, whatever part of a box lies past the tensor. A scaled operand
// (block_scaled_mainloop.cuh) is K-major, the one majorness 8-bit wgmma reads, and its kind also
// loads each k step's fp32 scales (the layouts src/quant/quantize_fp8.hpp writes).
#include <cstdint>

#include <cute/arch/copy_sm90_tma.hpp>

#include "caracal/gemm/grouped_gemm.hpp"
#include "caracal/gemm/grouped_gemm_fp8.hpp"
#include "device/gemm/gemm_config.cuh"
#include "device/gemm/gemm_policy.cuh"

namespace caracal::gemm {

inline constexpr uint64_t kLoadCacheHint = uint64_t(cute::TMA::CacheHintSm90::EVICT_NORMAL);

// One box into this CTA's `smem` (`to` 0), or multicast to the same offset in the CTAs of the
// cluster named by the mask `to` (tma_pair_pipeline.cuh), the transaction bytes completing the
// barrier at `full`'s offset in each.
__device__ inline void load_2d(CUtensorMap const* map, uint64_t* full, uint16_t to, void* smem, int c0, int c1) {
  if (to == 0) {
    cute::SM90_TMA_LOAD_2D::copy(map, full, kLoadCacheHint, smem, c0, c1);
  } else {
    cute::SM90_TMA_LOAD_MULTICAST_2D::copy(map, full, to, kLoadCacheHint, smem, c0, c1);
  }
}
__device__ inline void load_3d(CUtensorMap const* map, uint64_t* full, uint16_t to, void* smem, int c0, int c1,
                               int c2) {
  if (to == 0) {
    cute::SM90_TMA_LOAD_3D::copy(map, full, kLoadCacheHint, smem, c0, c1, c2);
  } else {
    cute::SM90_TMA_LOAD_MULTICAST_3D::copy(map, full, to, kLoadCacheHint, smem, c0, c1, c2);
  }
}

// An operand tile's scales in a stage, as its kind loads them: per row block one fp32 per MN row of
// the tile, a box of kRows from a [K/128][MN] map (MN contiguous); per 128 x 128 block one per 128
// MN rows, kFp8WeightScaleStep floats apart (caracal/gemm/grouped_gemm_fp8.hpp), the tile's first
// in a box of kBlockScaleBox from a [L][K/128][fp8_weight_scale_row(MN/128)] map (128-byte boxes
// into 128-byte aligned slots, ScaleTile::kSlot; a box's first float 16-byte aligned, as the TMA
// requires of the innermost coordinate).
inline constexpr int kBlockScaleBox = 32;
template <class Tile>
struct ScaleTile {
  static_assert(Tile::kScale != ScaleKind::kNone, "the scales of a scaled operand");
  static_assert(Tile::kScale != ScaleKind::kPerBlock ||
                Tile::kRows / kScaleBlock * kFp8WeightScaleStep <= kBlockScaleBox);
  static constexpr int kCount = Tile::kScale == ScaleKind::kPerRowBlock ? Tile::kRows : kBlockScaleBox;
  static constexpr uint32_t kBytes = uint32_t(kCount * sizeof(float));  // what the TMA box delivers
  // Floats a stage's slot takes: a TMA destination in shared memory is 128-byte aligned.
  static constexpr int kSlot = (kCount + 31) / 32 * 32;
};

// Where an MN-major box of `Tile` starting at `mn` is loaded from. MN-major operands are loaded as
// BlockK x kMnBox boxes stacked along MN (layout in mma_config.cuh); the wgmma reads them
// transposed from shared memory, so no operand is ever transposed in memory. A box lying wholly
// past the operand's MN extent (a multiple of kMnBox) is loaded from the extent's last kMnBox
// instead: it only feeds output rows or columns that are never stored, and no copy depends on how
// the TMA treats a box with no element in bounds.
template <class Tile>
__device__ int mn_box(int mn, int mn_extent) {
  return min(mn, mn_extent - Tile::kMnBox);
}

__device__ inline void load_5d(CUtensorMap const* map, uint64_t* full, uint16_t to, void* smem, int c0, int c1, int c2,
                               int c3, int c4) {
  if (to == 0) {
    cute::SM90_TMA_LOAD_5D::copy(map, full, kLoadCacheHint, smem, c0, c1, c2, c3, c4);
  } else {
    cute::SM90_TMA_LOAD_MULTICAST_5D::copy(map, full, to, kLoadCacheHint, smem, c0, c1, c2, c3, c4);
  }
}

// Each kind: load<Tile>(map, full, stage, mn, mn_extent, k, expert, to), the tile's k step at K
// index `k` into `stage`; a kind a scaled operand may have, load_scales<Tile>(map, full, scales, mn,
// k, expert, to): that k step's scales (ScaleTile) into `scales`. A K-major box reaching past a
// tensor's end is zero-filled by the TMA and still delivers its full byte count.

// A row buffer [row_capacity][K]: the forward's A, the backward dgrad's A; scaled one per row
// (1 x 128 blocks).
struct KMajorRows {
  static constexpr Major kMajor = Major::K;
  template <class Tile>
  __device__ static void load(CUtensorMap const* map, uint64_t* full, typename Tile::Element* smem, int mn,
                              int /*mn_extent*/, int k, int /*expert*/, uint16_t to = 0) {
    load_2d(map, full, to, smem, k, mn);
  }
  template <class Tile>
  __device__ static void load_scales(CUtensorMap const* map, uint64_t* full, float* scales, int mn, int k,
                                     int /*expert*/, uint16_t to = 0) {
    static_assert(Tile::kScale == ScaleKind::kPerRowBlock, "rows scaled per 1 x 128 block");
    load_2d(map, full, to, scales, mn, k / kScaleBlock);
  }
};

// Expert weights [L][N][K]: the forward's B; scaled one per 128 x 128 block.
struct KMajorWeights {
  static constexpr Major kMajor = Major::K;
  template <class Tile>
  __device__ static void load(CUtensorMap const* map, uint64_t* full, typename Tile::Element* smem, int mn,
                              int /*mn_extent*/, int k, int expert, uint16_t to = 0) {
    load_3d(map, full, to, smem, k, mn, expert);
  }
  template <class Tile>
  __device__ static void load_scales(CUtensorMap const* map, uint64_t* full, float* scales, int mn, int k, int expert,
                                     uint16_t to = 0) {
    static_assert(Tile::kScale == ScaleKind::kPerBlock, "weights scaled per 128 x 128 block");
    load_3d(map, full, to, scales, int(fp8_weight_scale_at(mn / kScaleBlock)), k / kScaleBlock, expert);
  }
};

// The gate/up weights [L][2I][K] in either row order, through their 5-D view
// (src/gemm/tensor_map.hpp, make_gate_up_view_map): a box of N rows lands in the interleaved
// order. The forward up/gate's B (bf16).
struct KMajorGateUpWeights {
  static constexpr Major kMajor = Major::K;
  static constexpr int kGroupRows = 2 * kGateUpInterleave;  // a gate group and its up group
  template <class Tile>
  __device__ static void load(CUtensorMap const* map, uint64_t* full, typename Tile::Element* smem, int mn,
                              int /*mn_extent*/, int k, int expert, uint16_t to = 0) {
    static_assert(Tile::kRows % kGroupRows == 0, "a box of whole gate/up groups");
    load_5d(map, full, to, smem, k, 0, 0, mn / kGroupRows, expert);
  }
};

// Expert weights [L][K][N]: the backward dgrad's B (W_down).
struct MNMajorWeights {
  static constexpr Major kMajor = Major::MN;
  template <class Tile>
  __device__ static void load(CUtensorMap const* map, uint64_t* full, typename Tile::Element* smem, int mn,
                              int mn_extent, int k, int expert, uint16_t to = 0) {
    CUTE_UNROLL
    for (int j = 0; j < Tile::kRows / Tile::kMnBox; ++j) {
      load_3d(map, full, to, smem + j * Tile::kMnBox * Tile::kBlockK,
              mn_box<Tile>(mn + j * Tile::kMnBox, mn_extent), k, expert);
    }
  }
};

// W_gate_up [L][K = 2I][N] in either row order, through its 5-D view (make_gate_up_view_map): each
// BlockK x kMnBox box lands as MNMajorWeights' does, its K rows in the interleaved order. The
// backward dx GEMM's B (bf16).
struct MNMajorGateUpWeights {
  static constexpr Major kMajor = Major::MN;
  static constexpr int kGroupRows = 2 * kGateUpInterleave;  // a gate group and its up group
  template <class Tile>
  __device__ static void load(CUtensorMap const* map, uint64_t* full, typename Tile::Element* smem, int mn,
                              int mn_extent, int k, int expert, uint16_t to = 0) {
    static_assert(Tile::kBlockK % kGroupRows == 0, "a box of whole gate/up groups");
    CUTE_UNROLL
    for (int j = 0; j < Tile::kRows / Tile::kMnBox; ++j) {
      load_5d(map, full, to, smem + j * Tile::kMnBox * Tile::kBlockK, mn_box<Tile>(mn + j * Tile::kMnBox, mn_extent),
              0, 0, k / kGroupRows, expert);
    }
  }
};

// A row buffer [row_capacity][MN]: both operands of the weight gradients, the buffer's rows being
// the GEMM's K.
struct MNMajorRows {
  static constexpr Major kMajor = Major::MN;
  template <class Tile>
  __device__ static void load(CUtensorMap const* map, uint64_t* full, typename Tile::Element* smem, int mn,
                              int mn_extent, int k, int /*expert*/, uint16_t to = 0) {
    CUTE_UNROLL
    for (int j = 0; j < Tile::kRows / Tile::kMnBox; ++j) {
      load_2d(map, full, to, smem + j * Tile::kMnBox * Tile::kBlockK, mn_box<Tile>(mn + j * Tile::kMnBox, mn_extent),
              k);
    }
  }
};

}  // namespace caracal::gemm
