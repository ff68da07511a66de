#pragma once
// A block-scaled K-major A operand gathered row by row: the FP8 up/gate's x in a world of one rank,
// read as the tokens' e4m3 rows and 1 x 128 scales at home (quantized there once) instead of from
// rows that dispatch_fp8 copied into schedule order first. Per tile each producer thread learns the
// tokens of its rows (schedule row r is route schedule_rows[r].y, token route / top_k; a padding
// route is negative: zeros); per k step (one 128-byte k tile of e4m3 codes) it copies its share of
// the codes with cp.async into the stage as the TMA lays a K-major row tile (gathered_rows.cuh's
// SWIZZLE_128B layout: row r's 16-byte unit u at unit u ^ (r % 8)), and thread t the scale of row t
// into the stage's ScaleTile (one float per row, operand_loads.cuh), then arrives on the stage's
// full barrier once its copies landed (kGatherArrivals of them besides the producer thread's
// arrive_and_expect_tx for B). Thread 8q + u copies unit u of rows q, q + 16, ..., q + 112.
#include <vector_types.h>  // int2

#include <cstdint>
#include <type_traits>

#include "device/gemm/gathered_rows.cuh"
#include "device/gemm/gemm_config.cuh"
#include "device/gemm/gemm_policy.cuh"

namespace caracal::gemm {

// Where a gathered e4m3 operand's rows are: token t's codes at codes + t * ld (K of them), its scale
// of K block b at scales[b * scale_block_stride + t] (the FP8 GEMMs' MN-major layout).
struct GatheredFp8RowsSource {
  const uint8_t* codes;
  const float* scales;
  const int2* schedule_rows;
  int64_t ld;
  int64_t scale_block_stride;
  int top_k;
};

// The operand kind (operand_loads.cuh's kinds load by TMA; this one by the producer warpgroup).
struct GatheredKMajorFp8Rows {
  static constexpr Major kMajor = Major::K;
  static constexpr bool kGathered = true;
};

template <class Kind, class = void>
inline constexpr bool kIsGathered = false;
template <class Kind>
inline constexpr bool kIsGathered<Kind, std::void_t<decltype(Kind::kGathered)>> = Kind::kGathered;

// One gathering thread's sources for a tile of kBlockM rows: its rows' codes at the thread's unit
// (nullptr: a padding row, zero-filled) and the scales of the row it copies scales for (K block b's
// at scale + b * scale_block_stride; nullptr: zeros).
struct GatheredFp8Tile {
  const uint8_t* codes[kGatherRowsPerThread];
  const float* scale;
  int scale_block_stride;  // a row count
};

// From the tokens' rows at `src`, for the schedule rows from `first_row`.
__device__ inline GatheredFp8Tile gathered_fp8_tile(GatheredFp8RowsSource const& src, int first_row, int thread) {
  auto token_of = [&](int row) {
    int const route = __ldg(&src.schedule_rows[first_row + row].y);
    return route >= 0 ? route / src.top_k : -1;
  };
  GatheredFp8Tile t;
  CUTE_UNROLL
  for (int j = 0; j < kGatherRowsPerThread; ++j) {
    int const token = token_of(gather_row(thread, j));
    t.codes[j] = token >= 0 ? src.codes + int64_t(token) * src.ld + (thread % 8) * 16 : nullptr;
  }
  int const token = token_of(thread);
  t.scale = token >= 0 ? src.scales + token : nullptr;
  t.scale_block_stride = int(src.scale_block_stride);
  return t;
}

// One 16-byte copy of a gathered row's unit: from `at`, `bytes` of them (16, or 0: zero-filled, `at`
// any valid global address, read for nothing).
struct UnitCopy {
  void const* at;
  uint32_t bytes;
};

// One gathering thread (`thread` in [0, kGatherThreads)), for every k tile of a tile: copies its
// units of k tile `k_index` into `stage` (`copy_of(j)`: row gather_row(thread, j)'s UnitCopy at the
// thread's unit of that k tile, the codes [k_index, k_index + 128) of the row) and its row's scale of
// that K block (`scale`: block 0's, the next blocks `scale_block_stride` apart; nullptr: zero) into
// `scales` (the stage's ScaleTile), and arms `full` with them. `any_address`: a valid global
// address, named by the zero-filling scale copy (which reads nothing).
template <class Tile, class CopyOf>
__device__ void gather_fp8_stage(CopyOf&& copy_of, float const* scale, int scale_block_stride,
                                 void const* any_address, int k_index, typename Tile::Element* stage, float* scales,
                                 uint64_t* full, int thread) {
  static_assert(sizeof(typename Tile::Element) == 1 && Tile::kBlockK == kScaleBlock && Tile::kRows == kBlockM &&
                    Tile::kScale == ScaleKind::kPerRowBlock,
                "a gathered stage holds a row block of e4m3 rows, one 1 x 128 block deep, scaled per row");
  int const unit = thread % 8;
  uint32_t const base = uint32_t(__cvta_generic_to_shared(stage));
  CUTE_UNROLL
  for (int j = 0; j < kGatherRowsPerThread; ++j) {
    int const row = gather_row(thread, j);
    UnitCopy const from = copy_of(j);
    uint32_t const to = base + uint32_t(row * 128 + ((unit ^ (row % 8)) << 4));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(to), "l"(from.at), "r"(from.bytes) : "memory");
  }
  bool const scaled = scale != nullptr;
  void const* const scale_at =
      scaled ? static_cast<void const*>(scale + int64_t(k_index / kScaleBlock) * scale_block_stride) : any_address;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(uint32_t(__cvta_generic_to_shared(scales + thread))),
               "l"(scale_at), "r"(scaled ? 4u : 0u)
               : "memory");
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(
                   uint32_t(__cvta_generic_to_shared(full)))
               : "memory");
}

// The same from a GatheredFp8Tile's sources.
template <class Tile>
__device__ void gather_fp8_k_tile(GatheredFp8Tile const& tile, void const* any_address, int k_index,
                                  typename Tile::Element* stage, float* scales, uint64_t* full, int thread) {
  gather_fp8_stage<Tile>(
      [&](int j) {
        uint8_t const* const codes = tile.codes[j];
        return codes != nullptr ? UnitCopy{codes + k_index, 16u} : UnitCopy{any_address, 0u};
      },
      tile.scale, tile.scale_block_stride, any_address, k_index, stage, scales, full, thread);
}

}  // namespace caracal::gemm
