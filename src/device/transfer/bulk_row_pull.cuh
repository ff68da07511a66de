#pragma once
// Pulling schedule rows with bulk asynchronous copies (cp.async.bulk, the TMA's 1-D form): one
// thread of a CTA streams its rows home -> shared memory -> expert-side buffer through a ring of
// row-sized stages, keeping up to a whole shared memory of bytes in flight. A warp-wide copy
// (row_copy.cuh) keeps 2 KiB in flight per warp, so a handful of CTAs cannot pull at the GPU's
// bandwidth that way; here one CTA keeps ~200 KiB in flight (measured: docs/PERF.md).
//
// The thread walks its rows j = 0, 1, ... (any increasing list of schedule rows): the load of
// row j + lead is issued once the store out of its stage (row j + lead - stages) has read the
// stage, which is the bulk group kStoresReading groups back; padding rows store a zeroed row
// instead of loading. on_written(j) is called, in order, for every row whose store has completed
// (written and visible to this thread: async proxy; a flag raised over them needs
// async_proxy_fence()): row j once the store kWriteLag groups later has been issued, so that the
// thread never waits for a write unless kWriteLag stores are in flight.
#include <cuda_bf16.h>

#include <cstdint>

#include <cute/arch/copy_sm90_tma.hpp>
#include <cutlass/arch/barrier.h>

namespace caracal::transfer {

inline constexpr int kBulkPullMaxStages = 16;
inline constexpr int kStoresReading = 4;  // stores that may still read their stage when a load is issued
inline constexpr int kWriteLag = 32;      // stores that may still be writing when rows are counted

// The stages a shared region of `bytes` holds for rows of `row_bytes`, one zero row kept aside.
__host__ __device__ inline int bulk_pull_stages(int bytes, int row_bytes) {
  const int stages = bytes / row_bytes - 1;
  return stages < kBulkPullMaxStages ? stages : kBulkPullMaxStages;
}

struct BulkPullSmem {
  uint8_t* stages;  // `count` row buffers, then one zeroed row; 16-byte aligned
  uint64_t* full;   // [count] mbarriers
  int count;        // > kStoresReading
  int row_bytes;    // a multiple of 16
};

// All threads of the CTA: zero the zero row, initialize the barriers. Before pull_rows_bulk.
__device__ inline void bulk_pull_init(const BulkPullSmem& s) {
  uint4* zero = reinterpret_cast<uint4*>(s.stages + static_cast<size_t>(s.count) * s.row_bytes);
  for (int i = static_cast<int>(threadIdx.x); i < s.row_bytes / 16; i += static_cast<int>(blockDim.x)) {
    zero[i] = make_uint4(0, 0, 0, 0);
  }
  if (threadIdx.x == 0) {
    for (int i = 0; i < s.count; ++i) cutlass::arch::ClusterTransactionBarrier::init(&s.full[i], 1);
    cutlass::arch::fence_barrier_init();
  }
  cutlass::arch::fence_view_async_shared();  // the zero row's generic writes, for the bulk stores
  __syncthreads();
}

// One thread. `source(j)`: the home row of row j (nullptr: padding); `dest(j)`: where it goes.
template <typename Source, typename Dest, typename Written>
__device__ void pull_rows_bulk(const BulkPullSmem& s, int rows, Source source, Dest dest, Written on_written) {
  const int lead = s.count - kStoresReading;
  const uint8_t* zero = s.stages + static_cast<size_t>(s.count) * s.row_bytes;
  const auto issue_load = [&](int j) {
    const void* src = source(j);
    if (src == nullptr) return;
    const int stage = j % s.count;
    cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&s.full[stage], static_cast<uint32_t>(s.row_bytes));
    cute::SM90_BULK_COPY_G2S::copy(src, &s.full[stage], s.stages + static_cast<size_t>(stage) * s.row_bytes,
                                   s.row_bytes);
  };
  for (int j = 0; j < lead && j < rows; ++j) issue_load(j);
  uint32_t phases = 0;  // bit i: parity of stage i's next completion
  int written = 0;
  for (int j = 0; j < rows; ++j) {
    const int stage = j % s.count;
    const void* src = source(j);
    const uint8_t* from = zero;
    if (src != nullptr) {
      cutlass::arch::ClusterTransactionBarrier::wait(&s.full[stage], (phases >> stage) & 1u);
      phases ^= 1u << stage;
      from = s.stages + static_cast<size_t>(stage) * s.row_bytes;
    }
    cute::SM90_BULK_COPY_S2G::copy(from, dest(j), s.row_bytes);
    cute::tma_store_arrive();  // one bulk group per row
    if (j >= kWriteLag) {
      asm volatile("cp.async.bulk.wait_group %0;" ::"n"(kWriteLag) : "memory");
      for (; written <= j - kWriteLag; ++written) on_written(written);
    }
    if (j + lead < rows) {
      // Row j + lead reuses the stage of row j + lead - count, whose store is kStoresReading
      // groups back: wait until it (and every earlier one) has read its stage.
      cute::tma_store_wait<kStoresReading>();
      issue_load(j + lead);
    }
  }
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
  for (; written < rows; ++written) on_written(written);
}

}  // namespace caracal::transfer
