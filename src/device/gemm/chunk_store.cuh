#pragma once
// Epilogue store path: a consumer warpgroup turns its accumulators into 8 KiB chunks (bf16 64 x 64,
// fp32 64 x 32 or e4m3 64 x 128), writes each into a 128B-swizzled shared-memory buffer
// (conflict-free stores) and stores it to global memory with one TMA copy. A ring of buffers per
// warpgroup (kChunkBuffers, or its policy's GemmPolicy::kChunkBuffers) lets the next chunk be
// written while the earlier ones' TMA stores still read theirs; the stores run on while the
// warpgroup goes on to the next tile's mainloop. Two barriers a chunk: the buffer is free before
// it is written, and written before its store is issued.
#include <cuda_bf16.h>

#include <cstdint>

#include <cute/arch/copy_sm90_tma.hpp>
#include <cutlass/arch/barrier.h>

#include "device/common/bf16_pairs.cuh"
#include "device/gemm/gemm_config.cuh"

namespace caracal::gemm {

// A chunk buffer's unit: a bf16 value (an fp32 value takes two).
using ChunkElement = cute::bfloat16_t;

// The epilogues' shared storage: each consumer warpgroup's ring of `Buffers` swizzled chunk buffers
// (one 128-byte swizzled TMA box each, on the 1024-byte swizzle period).
template <int Buffers>
struct ChunkStoreStorageOf {
  alignas(1024) ChunkElement chunks[kConsumerWarpgroups][Buffers][kChunkElements];
};
using ChunkStoreStorage = ChunkStoreStorageOf<kChunkBuffers>;

// One thread's share of a chunk (8 KiB: 64 x 64 bf16 or 64 x 32 fp32), in the accumulator's
// pattern (warp w, lane l of the warpgroup):
//   bf16: w[2*t + h] is the bf16 pair at row 16w + l/4 + 8h, columns 8t + 2(l%4) and +1;
//   fp32: w[4*t + 2*h + v] is the float at row 16w + l/4 + 8h, column 8t + 2(l%4) + v (t < 4).
struct ChunkWords {
  uint32_t w[16];
};

template <int Buffers>
class ChunkStoreRingOf {
 public:
  static constexpr int kBuffers = Buffers;
  static_assert(kBuffers >= 2, "a chunk is written while the last one's store reads its buffer");

  // `warpgroup`: consumer warpgroup index (0-based); `thread`: index within it (0..127).
  __device__ ChunkStoreRingOf(ChunkElement (&buffers)[kBuffers][kChunkElements], int warpgroup, int thread)
      : buffers_(&buffers[0][0]),
        base_(uint32_t(__cvta_generic_to_shared(&buffers[0][0]))),
        barrier_id_(uint32_t(warpgroup)),
        // Byte offset of this thread's first row, and of its first word in it; see write().
        row_base_(uint32_t((16 * (thread / 32) + (thread % 32) / 4) * kChunkCols * 2)),
        lane4_(uint32_t(thread % 4)),
        swizzle_(uint32_t((thread % 32) / 4)),
        thread_(thread),
        leader_(thread == 0) {}

  // Makes the thread's offsets opaque to the compiler until they are next used, so that the
  // swizzled offsets derived from them are computed there rather than hoisted out of a persistent
  // kernel's tile loop and held (eight registers) across its mainloop: call once a tile, before its
  // epilogue, where the consumers' registers are short.
  __device__ void rematerialize_offsets() {
    asm volatile("mov.b32 %0, %0;" : "+r"(swizzle_));
  }

  // Waits until the next buffer is no longer read by an earlier TMA store.
  __device__ void acquire() {
    if (leader_) cute::tma_store_wait<kBuffers - 1>();
    sync();
  }

  // Every thread writes its words. Rows are 128 bytes; the 16-byte unit t of row r sits at unit
  // t ^ (r % 8) (CU_TENSOR_MAP_SWIZZLE_128B). Here r % 8 == l / 4 for both of a thread's rows,
  // so the 32 lanes of a store hit 32 different banks.
  __device__ void write(ChunkWords const& words) const {
    uint32_t const buffer = base_ + uint32_t(index_) * kChunkElements * 2;
    CUTE_UNROLL
    for (int t = 0; t < 8; ++t) {
      CUTE_UNROLL
      for (int h = 0; h < 2; ++h) {
        uint32_t const addr = buffer + row_base_ + lane4_ * 4 + uint32_t(h * 8 * kChunkCols * 2) +
                              ((uint32_t(t) ^ swizzle_) << 4);
        asm volatile("st.shared.u32 [%0], %1;" ::"r"(addr), "r"(words.w[2 * t + h]) : "memory");
      }
    }
  }

  // The fp32 chunk: rows are again 128 bytes (32 floats); the thread's float pair of group t sits
  // in 16-byte unit 2t + (l%4)/2, at byte 8 (l%2) of it. Rows r and r^1 share units, so a warp's
  // 256 bytes take two wavefronts, the least they can.
  __device__ void write_f32(ChunkWords const& words) const {
    uint32_t const buffer = base_ + uint32_t(index_) * kChunkElements * 2;
    CUTE_UNROLL
    for (int t = 0; t < 4; ++t) {
      CUTE_UNROLL
      for (int h = 0; h < 2; ++h) {
        uint32_t const unit = (uint32_t(2 * t) + lane4_ / 2) ^ swizzle_;
        uint32_t const addr = buffer + row_base_ + uint32_t(h * 8 * kChunkCols * 2) + (unit << 4) + (lane4_ % 2) * 8;
        asm volatile("st.shared.v2.u32 [%0], {%1, %2};" ::"r"(addr), "r"(words.w[4 * t + 2 * h]),
                     "r"(words.w[4 * t + 2 * h + 1])
                     : "memory");
      }
    }
  }

  // The e4m3 chunk (64 x 128 codes: rows of 128 bytes again): w[2t + h] holds the codes of row
  // 16w + l/4 + 8h at columns 16t + 2(l%4), +1 (its low half) and 16t + 8 + 2(l%4), +1 (its high
  // half), i.e. accumulator groups 2t and 2t + 1 of a 128-column slice. Two 16-bit stores a word;
  // a store's 32 lanes fill both halves of 16 words in 16 different banks (8 rows' units, r % 8
  // differs): one wavefront.
  __device__ void write_e4m3(ChunkWords const& words) const {
    uint32_t const buffer = base_ + uint32_t(index_) * kChunkElements * 2;
    CUTE_UNROLL
    for (int t = 0; t < 8; ++t) {
      CUTE_UNROLL
      for (int h = 0; h < 2; ++h) {
        uint32_t const addr = buffer + row_base_ + lane4_ * 2 + uint32_t(h * 8 * kChunkCols * 2) +
                              ((uint32_t(t) ^ swizzle_) << 4);
        uint32_t const w = words.w[2 * t + h];
        asm volatile("st.shared.u16 [%0], %1;" ::"r"(addr), "h"(uint16_t(w)) : "memory");
        asm volatile("st.shared.u16 [%0], %1;" ::"r"(addr + 8), "h"(uint16_t(w >> 16)) : "memory");
      }
    }
  }

  // Publishes the buffer to the TMA unit and stores it at (col, row) of `map`'s tensor (whose box
  // is the chunk: 64 x 64 bf16, 64 x 32 fp32 or 64 x 128 e4m3).
  __device__ void store(CUtensorMap const* map, int col, int row) {
    cutlass::arch::fence_view_async_shared();  // generic-proxy writes -> visible to the TMA
    sync();
    if (leader_) {
      cute::SM90_TMA_STORE_2D::copy(map, buffers_ + index_ * kChunkElements, col, row);
      cute::tma_store_arrive();  // commits the store as one bulk group
    }
    index_ = (index_ + 1) % kBuffers;
  }
  // The same through a 5-D map (the gate/up view, src/gemm/tensor_map.hpp): coordinates c0..c4.
  __device__ void store(CUtensorMap const* map, int c0, int c1, int c2, int c3, int c4) {
    cutlass::arch::fence_view_async_shared();
    sync();
    if (leader_) {
      cute::SM90_TMA_STORE_5D::copy(map, buffers_ + index_ * kChunkElements, c0, c1, c2, c3, c4);
      cute::tma_store_arrive();
    }
    index_ = (index_ + 1) % kBuffers;
  }

  // The rows of a chunk whose units this thread stores in scatter(): scatter_row(j), j below this.
  static constexpr int kScatterRowsPerThread = kChunkRows * 8 / kWarpgroupThreads;
  __device__ int scatter_row(int j) const { return thread_ / 8 + j * (kWarpgroupThreads / 8); }

  // Instead of store(): publishes the buffer (a bf16 chunk) to the warpgroup's threads, and each
  // stores its rows' units with plain 16-byte stores, row scatter_row(j) at dst[j] + col (nullptr:
  // not stored), so the rows may go anywhere, another GPU included. Thread t stores unit t % 8 of
  // its rows: eight threads store one row's 128 bytes, a warp's store four whole row pieces.
  __device__ void scatter(__nv_bfloat16* const (&dst)[kScatterRowsPerThread], int col) {
    sync();
    uint32_t const buffer = base_ + uint32_t(index_) * kChunkElements * 2;
    uint32_t const unit = uint32_t(thread_ % 8);
    CUTE_UNROLL
    for (int j = 0; j < kScatterRowsPerThread; ++j) {
      if (dst[j] == nullptr) continue;
      uint32_t const r = uint32_t(scatter_row(j));
      uint4 v;
      asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                   : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                   : "r"(buffer + r * kChunkCols * 2 + ((unit ^ (r % 8)) << 4)));
      *reinterpret_cast<uint4*>(dst[j] + col + unit * 8) = v;
    }
    index_ = (index_ + 1) % kBuffers;
  }

  // Every thread of the warpgroup has issued its plain stores (scatter()'s, or an epilogue's own): a
  // barrier, after which one thread's release publishes them all.
  __device__ void plain_stores_issued() const { sync(); }

  // Every store issued by this warpgroup has completed (reads and writes): before the CTA exits.
  __device__ void drain() const {
    if (leader_) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
  }

 private:
  __device__ void sync() const {
    cutlass::arch::NamedBarrier::sync(kWarpgroupThreads, barrier_id_);
  }

  ChunkElement const* buffers_;  // generic address of buffer 0, for the TMA store
  uint32_t base_;           // its shared-memory address, for the stores into it
  uint32_t barrier_id_;
  uint32_t row_base_;
  uint32_t lane4_;
  uint32_t swizzle_;
  int thread_;
  bool leader_;
  int index_ = 0;
};
using ChunkStoreRing = ChunkStoreRingOf<kChunkBuffers>;

}  // namespace caracal::gemm
