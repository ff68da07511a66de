#pragma once
// The weight-gradient epilogues: a warpgroup's 64 x 256 fp32 slice of dW[e] stored as fp32
// (WeightGradEpilogue) or rounded to bf16 (WeightGradBf16Epilogue).
//
// fp32 by default because a weight gradient is a long sum over tokens that the optimizer (or a gradient
// accumulation over micro-batches) consumes in fp32; rounding it to bf16 here would lose what the
// fp32 accumulation kept. Stored straight from the registers: each quad of lanes writes one
// complete 32-byte sector (8 floats of a row) per instruction, streaming (.cs), since nothing in
// this pass reads the gradient back, and rows/columns past the gradient's edge are skipped.
// An inactive slice (the expert has no rows) stores zeros: experts without routes get exactly
// zero gradients.
#include <cstdint>

#include <cute/tensor.hpp>

#include "kernels/gemm/chunk_store.cuh"
#include "kernels/gemm/gemm_config.cuh"
#include "kernels/gemm/tile_coord.cuh"

namespace caracal::kernels::gemm {

struct WeightGradEpilogue {
  template <class Accum>
  __device__ static void apply(Params const& p, TileCoord const& tile, Accum const& acc,
                               bool active, ChunkStoreRing& /*ring*/, int warpgroup) {
    int const thread = int(threadIdx.x) % kWarpgroupThreads;
    int const lane = thread % 32;
    int const row = tile.m_begin + warpgroup * kWarpgroupRows + 16 * (thread / 32) + lane / 4;
    float* const grad = p.out_f32 + int64_t(tile.expert) * p.out_rows * p.out_cols;
    CUTE_UNROLL
    for (int h = 0; h < 2; ++h) {
      if (row + 8 * h >= p.out_rows) continue;
      float* const dst = grad + int64_t(row + 8 * h) * p.out_cols + tile.n_begin + 2 * (lane % 4);
      CUTE_UNROLL
      for (int t = 0; t < kBlockN / 8; ++t) {
        if (tile.n_begin + 8 * t >= p.out_cols) break;  // out_cols is a multiple of 64
        float2 v = make_float2(0.0f, 0.0f);
        if (active) v = make_float2(acc(4 * t + 2 * h), acc(4 * t + 2 * h + 1));
        __stcs(reinterpret_cast<float2*>(dst + 8 * t), v);
      }
    }
  }
};

// The bf16 variant: the same fp32 sums rounded once (nearest even), as autograd rounds fp32
// gradients of bf16 parameters; half the bytes, stored asynchronously through the chunk ring's
// TMA stores (p.out views the gradients as [num_experts * out_rows][out_cols]), so the warpgroup
// goes on to its next tile while they drain.
struct WeightGradBf16Epilogue {
  template <class Accum>
  __device__ static void apply(Params const& p, TileCoord const& tile, Accum const& acc,
                               bool active, ChunkStoreRing& ring, int warpgroup) {
    int const slice_row = tile.m_begin + warpgroup * kWarpgroupRows;
    // Past the gradient's rows (out_rows % 128 == 64): the 2D view would reach the next expert.
    if (slice_row >= p.out_rows) return;  // uniform over the warpgroup
    int const row = tile.expert * p.out_rows + slice_row;
    CUTE_UNROLL
    for (int c = 0; c < kBlockN / kChunkCols; ++c) {
      if (tile.n_begin + c * kChunkCols >= p.out_cols) break;  // out_cols is a multiple of 64
      ChunkWords words{};  // an inactive slice stores zeros
      if (active) {
        CUTE_UNROLL
        for (int t = 0; t < kChunkCols / 8; ++t) {
          CUTE_UNROLL
          for (int h = 0; h < 2; ++h) {
            int const i = 4 * (kChunkCols / 8 * c + t) + 2 * h;
            words.w[2 * t + h] = pack_bf16x2(acc(i), acc(i + 1));
          }
        }
      }
      ring.acquire();
      ring.write(words);
      ring.store(&p.out, tile.n_begin + c * kChunkCols, row);
    }
  }
};

}  // namespace caracal::kernels::gemm
