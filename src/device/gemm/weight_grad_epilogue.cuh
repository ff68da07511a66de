#pragma once
// The weight-gradient epilogues: a warpgroup's 64 x 256 fp32 slice of dW[e] stored as fp32
// (WeightGradEpilogue) or rounded to bf16 (WeightGradBf16Epilogue).
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

namespace caracal::gemm {

// Both store a warpgroup's slice chunk by chunk through the chunk ring's TMA stores (p.grad views
// the gradients as [num_experts * grad_rows][grad_cols]), so the warpgroup goes on to its next tile
// while they drain. kBf16: 64-column bf16 chunks, the fp32 sums rounded once (nearest even), as
// autograd rounds fp32 gradients of bf16 parameters; otherwise 32-column fp32 chunks.
struct WeightGradEpilogueParams {
  CUtensorMap grad;  // [num_experts * grad_rows][grad_cols]: fp32 box 64 x 32, or bf16 64 x 64
  int grad_rows;     // M of one expert's gradient
  int grad_cols;     // N, a multiple of 64
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
  static constexpr int kCols = kBf16 ? kChunkCols : kChunkCols / 2;  // columns of an 8 KiB chunk

  template <class Accum>
  __device__ static void apply(Params const& p, TileCoord const& tile, Accum const& acc,
                               bool active, ChunkStoreRing& ring, int warpgroup) {
    int const slice_row = tile.m_begin + warpgroup * kWarpgroupRows;
    // Past the gradient's rows (out_rows % 128 == 64): the 2D view would reach the next expert.
    if (slice_row >= p.grad_rows) return;  // uniform over the warpgroup
    int const row = tile.expert * p.grad_rows + slice_row;
    CUTE_UNROLL
    for (int c = 0; c < kBlockN / kCols; ++c) {
      if (tile.n_begin + c * kCols >= p.grad_cols) break;  // a multiple of 64
      ChunkWords words{};  // an inactive slice (an expert without rows) stores zeros
      if (active) {
        CUTE_UNROLL
        for (int t = 0; t < kCols / 8; ++t) {
          CUTE_UNROLL
          for (int h = 0; h < 2; ++h) {
            int const i = 4 * (kCols / 8 * c + t) + 2 * h;
            if constexpr (kBf16) {
              words.w[2 * t + h] = pack_bf16x2(acc(i), acc(i + 1));
            } else {
              words.w[4 * t + 2 * h] = accumulator_bits(acc(i));
              words.w[4 * t + 2 * h + 1] = accumulator_bits(acc(i + 1));
            }
          }
        }
      }
      ring.acquire();
      if constexpr (kBf16) {
        ring.write(words);
      } else {
        ring.write_f32(words);
      }
      ring.store(&p.grad, tile.n_begin + c * kCols, row);
    }
  }
};

using WeightGradEpilogue = WeightGradTmaEpilogue<false>;
using WeightGradBf16Epilogue = WeightGradTmaEpilogue<true>;

}  // namespace caracal::gemm
