#pragma once
// The skeleton of every persistent warp-specialized kernel of the library: the standalone grouped
// GEMM (grouped_gemm_kernel.cuh), its CTA pairs (paired_gemm_kernel.cuh), the fused forward and
// backward (src/fused/forward_compute.cuh, backward_compute.cuh). After the prologue, warpgroup 0
// produces (takes tasks, waits for what they read, streams their operands through the stage ring;
// its idle warps may take other work) and warpgroups 1 and 2 consume (wgmma over the ring, the
// epilogue, publishing what a task raised). The hooks are inlined functors. A kernel dispatches the
// roles itself (`if (warpgroup_role() == 0) run_producer_warpgroup(...); else
// run_consumer_warpgroup(...);`) or writes a role out where a role function changes its SASS.
#include <cstdint>

#include <cute/tensor.hpp>
#include <cutlass/arch/reg_reconfig.h>

#include "device/gemm/chunk_store.cuh"
#include "device/gemm/gemm_config.cuh"
#include "device/gemm/mainloop.cuh"

namespace caracal::gemm {

// The CTA's shared storage: the policy's stage ring and the epilogues' chunk buffers.
template <class Policy>
struct KernelStorage {
  typename Mainloop<Policy>::Storage mainloop;
  ChunkStoreStorageOf<Policy::kChunkBuffers> epilogue;
};
// The dynamic shared-memory base is only documented as 16-byte aligned: a storage that leaves room
// asks for 1 KiB of slack and rounds the base up to the 1024-byte swizzle period. One that fills the
// 227 KiB takes the base as it comes, 1024-byte aligned on Hopper (no static shared memory; the
// driver's reserved 1 KiB sits before it, as CUTLASS's and DeepGEMM's kernels assume), and traps if
// it is not.
inline constexpr int kMaxSmemBytes = 227 * 1024;
template <class Policy>
inline constexpr bool kSmemSlack = int(sizeof(KernelStorage<Policy>)) + 1024 <= kMaxSmemBytes;
template <class Policy>
inline constexpr int kSmemBytes = int(sizeof(KernelStorage<Policy>)) + (kSmemSlack<Policy> ? 1024 : 0);

template <class Policy>
__device__ KernelStorage<Policy>& kernel_storage(uint8_t* smem_raw) {
  static_assert(kSmemBytes<Policy> <= kMaxSmemBytes, "over the 227 KiB of shared memory a Hopper block may use");
  uintptr_t const base = reinterpret_cast<uintptr_t>(smem_raw);
  if constexpr (kSmemSlack<Policy>) {
    return *reinterpret_cast<KernelStorage<Policy>*>((base + 1023) & ~uintptr_t(1023));
  } else {
    if (base % 1024 != 0) __trap();
    return *reinterpret_cast<KernelStorage<Policy>*>(base);
  }
}

// This thread's warpgroup: 0 produces, 1 and 2 consume. Warp-uniform (the shuffle tells the
// compiler so).
__device__ __forceinline__ int warpgroup_role() {
  return __shfl_sync(0xffffffffu, int(threadIdx.x) / kWarpgroupThreads, 0);
}

// The prologue: thread 0 runs `init()` (the barriers of the stage ring, the descriptors' prefetch),
// then every thread runs `sync()` (__syncthreads, or the cluster's barrier where CTAs share stages).
template <class Init, class Sync>
__device__ __forceinline__ void start_persistent_cta(Init&& init, Sync&& sync) {
  if (threadIdx.x == 0) init();
  sync();
}

// The producer warpgroup (warpgroup 0) after the prologue: gives registers back, then runs
// `produce()` on its 128 threads.
template <uint32_t ProducerRegisters, class Produce>
__device__ __forceinline__ void run_producer_warpgroup(Produce&& produce) {
  cutlass::arch::warpgroup_reg_dealloc<ProducerRegisters>();
  produce();
}

// A consumer warpgroup (`warpgroup` 1 or 2) after the prologue: takes registers, then runs
// `consume(tiled_mma, tCrA, tCrB, scales, accum, ring, consumer, wg_thread)` (`consumer` 0 or 1,
// `wg_thread` its thread in [0, 128)) and drains its chunk stores.
template <class Policy, class Mma, uint32_t ConsumerRegisters, class Consume>
__device__ __forceinline__ void run_consumer_warpgroup(KernelStorage<Policy>& smem, int warpgroup, Consume&& consume) {
  using namespace cute;
  cutlass::arch::warpgroup_reg_alloc<ConsumerRegisters>();
  int const consumer = warpgroup - 1;                       // 0 or 1
  int const thread = int(threadIdx.x) - kWarpgroupThreads;  // 0..255
  int const wg_thread = thread % kWarpgroupThreads;

  typename Mma::TiledMma tiled_mma;
  auto thr_mma = tiled_mma.get_thread_slice(thread);
  Tensor sA = make_tensor(make_smem_ptr(&smem.mainloop.a[0][0]), typename Mma::SmemLayoutA{});
  Tensor sB = make_tensor(make_smem_ptr(&smem.mainloop.b[0][0]), typename Mma::SmemLayoutB{});
  Tensor tCrA = thr_mma.make_fragment_A(thr_mma.partition_A(sA));
  Tensor tCrB = thr_mma.make_fragment_B(thr_mma.partition_B(sB));
  auto const scales = Mainloop<Policy>::stage_scales(smem.mainloop, thread);
  Tensor accum = partition_fragment_C(tiled_mma, Shape<Int<Policy::kBlockM>, Int<Policy::kBlockN>>{});
  static_assert(kTileNOf<decltype(accum)> == Policy::kBlockN, "the accumulators cover the policy's tile");

  ChunkStoreRing ring(smem.epilogue.chunks[consumer], consumer, wg_thread);
  consume(tiled_mma, tCrA, tCrB, scales, accum, ring, consumer, wg_thread);
  ring.drain();
}

}  // namespace caracal::gemm
