#pragma once
// The weight-gradient epilogues: a warpgroup's 64 x N fp32 slice of dW[e] (N the policy's tile:
// 256 for bf16 operands, 128 for FP8) stored as fp32 (WeightGradEpilogue) or rounded to bf16
// (WeightGradBf16Epilogue).
//
// fp32 by default because a weight gradient is a long sum over tokens that the optimizer (or a
// gradient accumulation over micro-batches) consumes in fp32; rounding it to bf16 here would lose
// what the fp32 accumulation kept, unless the parameters are bf16 anyway (then bf16 halves the
// bytes). An inactive slice (the expert has no rows) stores zeros: experts without routes get
// exactly zero gradients. Rows/columns past the gradient's edge are skipped.
#include <cstdint>

#include <cute/tensor.hpp>

#include "device/gemm/chunk_store.cuh"
#include "device/gemm/gemm_config.cuh"
#include "device/gemm/tile_coord.cuh"
#include "device/gemm/weight_tile_scheduler.cuh"

namespace caracal::gemm {

// Both store a warpgroup's slice chunk by chunk through the chunk ring's TMA stores (p.grad views
// the gradients as [num_experts * grad_rows][grad_cols], or dW_gate_up through its gate/up view in
// either row order), so the warpgroup goes on to its next tile
// while they drain. kBf16: 64-column bf16 chunks, the fp32 sums rounded once (nearest even), as
// autograd rounds fp32 gradients of bf16 parameters; otherwise 32-column fp32 chunks.
//
// Over a window of the schedule (weight_tile_scheduler.cuh) an expert's sum may start from a
// partial (load_partial, before the mainloop: the accumulators continue from its fp32 bits) and
// stop at one (stored in fp32 to partial_out): an fp32 gradient is its own partial; a bf16 one
// keeps it in an fp32 scratch of one expert's gradient, which the caller alternates between two
// windows (one reads the last window's while it writes its own).
struct WeightGradEpilogueParams {
  CUtensorMap grad;         // [num_experts * grad_rows][grad_cols]: fp32 box 64 x 32, or bf16 64 x 64
  CUtensorMap partial_out;  // fp32 [partial rows][grad_cols], box 64 x 32: grad (fp32), or the scratch
  int partial_out_expert_rows;       // rows between experts in partial_out: grad_rows, or 0 (scratch)
  const float* partial_in;           // the partials the window continues from, [rows][grad_cols]
  int64_t partial_in_expert_floats;  // floats between experts there: grad_rows * grad_cols, or 0
  int grad_rows;                     // M of one expert's gradient
  int grad_cols;                     // N, a multiple of 64
  // grad is W_gate_up's gradient through its gate/up view (src/gemm/tensor_map.hpp: 5-D, a slice's
  // interleaved rows stored in the order memory holds), at (col, 0, 0, row / 16, expert).
  bool grad_view;
  int partial_in_halves;  // I when partial_in's rows lie in [gate; up] halves order (an fp32 gradient so stored), else 0
};

// An accumulator's bits, copied through a register move: fed straight into the shared-memory
// stores, the accumulator registers made ptxas serialize the kernel's wgmmas (C7514, fp32 kernel).
__device__ inline uint32_t accumulator_bits(float v) {
  uint32_t bits;
  asm volatile("mov.b32 %0, %1;" : "=r"(bits) : "f"(v));
  return bits;
}

template <bool kBf16>
struct WeightGradTmaEpilogue {
  using Params = WeightGradEpilogueParams;  // the same for both: one host builder
  static constexpr bool kLoadsPartials = true;

  // Before the mainloop of a tile whose expert's sum continues from a partial: the warpgroup's
  // slice of it into the accumulators (layout in gemm_config.cuh: value 4t + 2h + v at row
  // 16w + l/4 + 8h, column 8t + 2(l%4) + v). Returns whether it did (the mainloop then adds to
  // them instead of starting from zero).
  template <class Accum>
  __device__ static bool load_partial(Params const& p, TileCoord const& tile, ExpertWindow const& window, Accum& acc,
                                      int warpgroup) {
    int const slice_row = tile.m_begin + warpgroup * kWarpgroupRows;
    if (tile.k_tiles == 0 || slice_row >= p.grad_rows || !window.continues) return false;
    int const thread = int(threadIdx.x) % kWarpgroupThreads;
    int const lane = thread % 32;
    // The thread's rows r and r + 8 (r % 16 < 8: a gate row of the interleaved order and its up row).
    int const r = slice_row + 16 * (thread / 32) + lane / 4;
    const float* src = p.partial_in + tile.expert * p.partial_in_expert_floats + tile.n_begin + 2 * (lane % 4);
    CUTE_UNROLL
    for (int t = 0; t < kTileNOf<Accum> / 8; ++t) {
      CUTE_UNROLL
      for (int h = 0; h < 2; ++h) {
        int const row = p.partial_in_halves != 0 ? h * p.partial_in_halves + 8 * (r / 16) + r % 8 : r + 8 * h;
        float2 v = make_float2(0.0f, 0.0f);
        if (tile.n_begin + 8 * t < p.grad_cols) {
          v = *reinterpret_cast<const float2*>(src + int64_t(row) * p.grad_cols + 8 * t);
        }
        acc(4 * t + 2 * h) = v.x;
        acc(4 * t + 2 * h + 1) = v.y;
      }
    }
    return true;
  }

  template <class Accum, class Ring>
  __device__ static void apply(Params const& p, TileCoord const& tile, ExpertWindow const& window, Accum const& acc,
                               bool active, Ring& ring, int warpgroup) {
    int const slice_row = tile.m_begin + warpgroup * kWarpgroupRows;
    // Past the gradient's rows (out_rows % 128 == 64): the 2D view would reach the next expert.
    if (slice_row >= p.grad_rows) return;  // uniform over the warpgroup
    if constexpr (kBf16) {
      if (window.stops) {  // the sum goes on in the next window
        store_slice<false>(p, &p.partial_out, SliceAt{tile.expert * p.partial_out_expert_rows + slice_row}, tile,
                           acc, active, ring);
        return;
      }
    }
    SliceAt const at =
        p.grad_view ? SliceAt{slice_row / 16, tile.expert} : SliceAt{tile.expert * p.grad_rows + slice_row};
    store_slice<kBf16>(p, &p.grad, at, tile, acc, active, ring);
  }

 private:
  // Where a slice goes: row `row` of a 2-D map, or with expert >= 0 gate/up group `row` of that
  // expert's view.
  struct SliceAt {
    int row;
    int expert = -1;
  };

  // The slice at `at` of `map`'s tensor: bf16 (kChunkBf16) or fp32 chunks.
  template <bool kChunkBf16, class Accum, class Ring>
  __device__ static void store_slice(Params const& p, CUtensorMap const* map, SliceAt at, TileCoord const& tile,
                                     Accum const& acc, bool active, Ring& ring) {
    constexpr int kCols = kChunkBf16 ? kChunkCols : kChunkCols / 2;  // columns of an 8 KiB chunk
    CUTE_UNROLL
    for (int c = 0; c < kTileNOf<Accum> / kCols; ++c) {
      if (tile.n_begin + c * kCols >= p.grad_cols) break;  // a multiple of 64
      ChunkWords words{};  // an inactive slice (an expert without rows) stores zeros
      if (active) {
        CUTE_UNROLL
        for (int t = 0; t < kCols / 8; ++t) {
          CUTE_UNROLL
          for (int h = 0; h < 2; ++h) {
            int const i = 4 * (kCols / 8 * c + t) + 2 * h;
            if constexpr (kChunkBf16) {
              words.w[2 * t + h] = pack_bf16x2(acc(i), acc(i + 1));
            } else {
              words.w[4 * t + 2 * h] = accumulator_bits(acc(i));
              words.w[4 * t + 2 * h + 1] = accumulator_bits(acc(i + 1));
            }
          }
        }
      }
      ring.acquire();
      if constexpr (kChunkBf16) {
        ring.write(words);
      } else {
        ring.write_f32(words);
      }
      if (at.expert >= 0) {
        ring.store(map, tile.n_begin + c * kCols, 0, 0, at.row, at.expert);
      } else {
        ring.store(map, tile.n_begin + c * kCols, at.row);
      }
    }
  }
};

using WeightGradEpilogue = WeightGradTmaEpilogue<false>;
using WeightGradBf16Epilogue = WeightGradTmaEpilogue<true>;

}  // namespace caracal::gemm
