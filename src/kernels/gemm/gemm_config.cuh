#pragma once
// The tile configuration shared by the grouped-GEMM kernels: tile sizes, warp roles, the
// shared-memory layout and the launch parameters.
//
//   CTA tile 128 x 256 x 64 (M x N x K), bf16 operands, fp32 accumulators.
//   Warpgroup 0: producer. One thread streams A (128 x 64) and B (256 x 64) tiles with TMA into a
//                kStages-deep ring of 128B-swizzled buffers (48 KiB a stage).
//   Warpgroups 1, 2: consumers. Each owns 64 rows of the tile: 64 x 256 x 16 wgmma, both operands
//                from shared memory, 128 fp32 accumulators a thread; then the epilogue.
// The operands' majorness (K- or MN-major in memory) is a per-kernel choice: mma_config.cuh.
#include <cuda.h>  // CUtensorMap
#include <cuda_bf16.h>

#include <cstdint>

#include <cute/tensor.hpp>  // also brings the GMMA atoms

#include "caracal/kernels/grouped_gemm.hpp"
#include "kernels/gemm/tile_shape.hpp"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error \
    "the grouped GEMM needs the arch-specific Hopper target: -gencode=arch=compute_90a,code=sm_90a"
#endif

namespace caracal::kernels::gemm {

using Element = cute::bfloat16_t;  // same bits as __nv_bfloat16
static_assert(sizeof(Element) == 2);
using cute::GMMA::Major;  // K- or MN-major operands

inline constexpr int kStages = 4;  // 4 x 48 KiB in flight

inline constexpr int kWarpgroupThreads = 128;
inline constexpr int kConsumerWarpgroups = 2;
inline constexpr int kThreads = (1 + kConsumerWarpgroups) * kWarpgroupThreads;
inline constexpr int kConsumerWarps = kConsumerWarpgroups * kWarpgroupThreads / 32;
inline constexpr int kWarpgroupRows = kBlockM / kConsumerWarpgroups;  // 64 = one wgmma M

// setmaxnreg budgets: the producer needs few registers, the consumers hold 128 accumulators.
// 40 x 128 + 232 x 256 = 64512 <= 65536 registers of the SM.
inline constexpr uint32_t kProducerRegisters = 40;
inline constexpr uint32_t kConsumerRegisters = 232;

// Epilogue: each consumer warpgroup stages bf16 64 x 64 chunks (one 128-byte swizzled TMA box)
// in a ring of kChunkBuffers buffers, so writing one chunk overlaps the TMA store of the last.
inline constexpr int kChunkRows = kWarpgroupRows;
inline constexpr int kChunkCols = 64;
inline constexpr int kChunkBuffers = 2;
inline constexpr int kChunkElements = kChunkRows * kChunkCols;

// Tiles of one expert are visited in groups of this many M blocks, N blocks outer, M blocks
// inner: the CTAs running at one time share a few A blocks and a few weight slabs in L2.
inline constexpr int kRasterGroupBlocks = 8;

// The epilogues index the accumulator fragment directly; mma_config.cuh pins the layout they
// assume (CuTe's SM90 64xN fp32 accumulator): value i = v0 + 2*v1 + 4*t of a thread (warp w,
// lane l of its warpgroup) is element (row 16w + l/4 + 8*v1, column 8t + 2*(l%4) + v0) of the
// warpgroup's 64 x kBlockN slice.
inline constexpr int kAccumulators = kBlockN / 2;  // per thread: 64 * kBlockN / 128

// Bytes the TMA deposits per stage: one A tile and one B tile.
inline constexpr uint32_t kStageBytes = uint32_t(sizeof(Element)) * (kBlockM + kBlockN) * kBlockK;

struct SharedStorage {
  // Swizzled buffers start on a 1024-byte (swizzle period) boundary: TMA and the wgmma
  // descriptors both derive the swizzle from address bits, assuming that base.
  alignas(1024) Element a[kStages][kBlockM * kBlockK];
  alignas(1024) Element b[kStages][kBlockN * kBlockK];
  alignas(1024) Element chunks[kConsumerWarpgroups][kChunkBuffers][kChunkElements];
  alignas(8) uint64_t full[kStages];   // TMA bytes of the stage landed
  alignas(8) uint64_t empty[kStages];  // every consumer warp is done reading the stage
};
// The dynamic shared-memory base is only guaranteed 16-byte aligned: ask for 1 KiB of slack.
inline constexpr int kSmemBytes = int(sizeof(SharedStorage)) + 1024;
static_assert(kSmemBytes <= 227 * 1024, "over the 227 KiB of shared memory a Hopper block may use");

// Launch parameters of every grouped-GEMM kernel (one struct, passed as a __grid_constant__ so
// the TMA descriptors stay in parameter space where the TMA unit can read them). A kernel reads
// only the fields its operands, scheduler and epilogue name.
struct Params {
  CUtensorMap a;        // A operand (operand_loads.cuh gives each kind's tensor and box)
  CUtensorMap b;        // B operand
  CUtensorMap out;      // main bf16 output [row_capacity][out_cols], box 64 x 64 (weight
                        // gradients: [num_experts * out_rows][out_cols], bf16 or fp32 64 x 32)
  CUtensorMap out_aux;  // second bf16 output [row_capacity][aux_cols], box 64 x 64 (if stored)
  CUtensorMap source;   // SwiGLU backward: the saved gate_up [row_capacity][2I], box 64 x 128,
                        // prefetched into L2 ahead of the epilogue
  int a_mn_extent;      // MN extent of an MN-major A (rows of its output); unused when K-major
  int b_mn_extent;      // MN extent of an MN-major B (columns of its output); unused when K-major
  const int32_t* expert_offset;
  const int32_t* expert_count;  // may be null
  int num_experts;
  int capacity_blocks;  // row_capacity / kBlockM
  int m_blocks;         // weight tiles: ceil(out_rows / kBlockM)
  int n_blocks;         // ceil(N / kBlockN)
  int k_tiles;          // row tiles: K / kBlockK
  int out_rows;         // weight tiles: rows of one expert's gradient (M)
  int out_cols;         // columns of `out`
  int aux_cols;         // columns of `out_aux`
  bool store_aux;
  // SwiGLU backward epilogue
  const __nv_bfloat16* gate_up;  // [row_capacity][2I], interleaved
  const float* row_gates;        // [row_capacity] g per row
  float* dg_partials;            // [row_capacity][n_blocks]
};

}  // namespace caracal::kernels::gemm
