#pragma once
// What the grouped-GEMM kernels share whatever their policy (gemm_policy.cuh: precision, tile,
// stages): warp roles, register budgets, the epilogues' chunks. Each collective has its own
// parameters and shared storage (mainloop.cuh, the epilogues, the schedulers);
// grouped_gemm_kernel.cuh composes them.
//
//   Warpgroup 0: producer. One thread streams the A and B tiles of each k step with TMA into the
//                policy's ring of 128B-swizzled stages.
//   Warpgroups 1, 2: consumers. Each owns 64 rows of the tile: 64 x N wgmma, both operands from
//                shared memory, fp32 accumulators; then the epilogue.
// The operands' majorness (K- or MN-major in memory) is a per-kernel choice: mma_config.cuh.
#include <cuda.h>  // CUtensorMap
#include <cuda_bf16.h>

#include <cstdint>
#include <utility>

#include <cute/tensor.hpp>  // also brings the GMMA atoms

#include "device/gemm/tile_shape.hpp"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error \
    "the grouped GEMM needs the arch-specific Hopper target: -gencode=arch=compute_90a,code=sm_90a"
#endif

namespace caracal::gemm {

using cute::GMMA::Major;  // K- or MN-major operands

inline constexpr int kWarpgroupThreads = 128;
inline constexpr int kConsumerWarpgroups = 2;
inline constexpr int kThreads = (1 + kConsumerWarpgroups) * kWarpgroupThreads;
inline constexpr int kConsumerWarps = kConsumerWarpgroups * kWarpgroupThreads / 32;
// The producer warpgroup's warps besides the one whose thread issues the loads (warps 1-3), idle in
// the GEMM: kernels may give them work under the tiles (grouped_gemm_kernel.cuh's IdleWarps, the
// fused backward's copies and dx sums).
inline constexpr int kIdleWarpsPerCta = kWarpgroupThreads / 32 - 1;
inline constexpr int kWarpgroupRows = kBlockM / kConsumerWarpgroups;  // 64 = one wgmma M

// setmaxnreg budgets: the producer needs few registers, the consumers hold 128 accumulators.
// producer x 128 + consumer x 256 <= 64512 (168 per thread at launch, 384 threads); multiples of 8.
struct RegisterSplit {
  uint32_t producer, consumer;
};
inline constexpr RegisterSplit kDefaultRegisterSplit{40, 232};

// Whether a split fits the registers the launch allotted the CTA (168 a thread at kThreads): a
// setmaxnreg.inc waits until the CTA's pool holds the registers it asks for, so a split past the
// pool (even within the SM's 65536) hangs the consumers at their first instruction.
constexpr bool fits_launch_registers(RegisterSplit r) {
  return r.producer * kWarpgroupThreads + r.consumer * kConsumerWarpgroups * kWarpgroupThreads <= 168 * kThreads &&
         r.producer % 8 == 0 && r.consumer % 8 == 0;
}
static_assert(fits_launch_registers({56, 224}) && !fits_launch_registers({64, 224}),
              "64 + 2 x 224 is the SM's 512 a thread-triple but past the launch's 504: it hung");

// Epilogue: each consumer warpgroup stages bf16 64 x 64 chunks (one 128-byte swizzled TMA box)
// in a ring of kChunkBuffers buffers (a policy may ask for more), so writing one chunk overlaps the
// TMA store of the last.
inline constexpr int kChunkRows = kWarpgroupRows;
inline constexpr int kChunkCols = 64;
inline constexpr int kChunkBuffers = 2;
inline constexpr int kChunkElements = kChunkRows * kChunkCols;

// The epilogues index the accumulator fragment directly; mma_config.cuh pins the layout they
// assume (CuTe's SM90 64xN fp32 accumulator): value i = v0 + 2*v1 + 4*t of a thread (warp w,
// lane l of its warpgroup) is element (row 16w + l/4 + 8*v1, column 8t + 2*(l%4) + v0) of the
// warpgroup's 64 x N slice. Their loops run over the tile's N as the fragment gives it (N / 2
// values a thread: 64 * N / 128), so one epilogue serves every policy's tile.
template <class Accum>
inline constexpr int kTileNOf = 2 * int(decltype(cute::size(std::declval<Accum const&>()))::value);

}  // namespace caracal::gemm
