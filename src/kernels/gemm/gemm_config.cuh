#pragma once
// The tile configuration shared by the grouped-GEMM kernels: tile sizes, warp roles, the
// shared-memory layout and the launch parameters.
//
//   CTA tile 128 x 256 x 64 (M x N x K), bf16 operands, fp32 accumulators.
//   Warpgroup 0: producer. One thread streams A (128 x 64) and B (256 x 64) tiles with TMA into a
//                kStages-deep ring of 128B-swizzled buffers (48 KiB a stage).
//   Warpgroups 1, 2: consumers. Each owns 64 rows of the tile: 64 x 256 x 16 wgmma, both operands
//                from shared memory, 128 fp32 accumulators a thread; then the epilogue, which
//                stages bf16 64 x 64 chunks in shared memory and stores them with TMA.
#include <cuda.h>  // CUtensorMap

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

// Epilogue: each consumer warpgroup stages 64 x 64 bf16 chunks (one 128-byte swizzled TMA box)
// in a ring of kChunkBuffers buffers, so writing one chunk overlaps the TMA store of the last.
inline constexpr int kChunkRows = kWarpgroupRows;
inline constexpr int kChunkCols = 64;
inline constexpr int kChunkBuffers = 2;
inline constexpr int kChunkElements = kChunkRows * kChunkCols;

// Tiles of one expert are visited in groups of this many M blocks, N blocks outer, M blocks
// inner: the CTAs running at one time share a few A blocks and a few weight slabs in L2.
inline constexpr int kRasterGroupBlocks = 8;

// K-major operand tiles in the 128B-swizzle atom (8 rows x 64 bf16) that both TMA
// (CU_TENSOR_MAP_SWIZZLE_128B) and the wgmma descriptors understand; stacked (rows, 64, stage).
using SmemLayoutA = decltype(cute::tile_to_shape(
    cute::GMMA::Layout_K_SW128_Atom<Element>{},
    cute::make_shape(cute::Int<kBlockM>{}, cute::Int<kBlockK>{}, cute::Int<kStages>{})));
using SmemLayoutB = decltype(cute::tile_to_shape(
    cute::GMMA::Layout_K_SW128_Atom<Element>{},
    cute::make_shape(cute::Int<kBlockN>{}, cute::Int<kBlockK>{}, cute::Int<kStages>{})));

// Two consumer warpgroups stacked along M, each issuing 64 x kBlockN x 16 wgmma.
using MmaAtom =
    decltype(cute::GMMA::ss_op_selector<Element, Element, float,
                                        cute::Shape<cute::_64, cute::Int<kBlockN>, cute::_16>,
                                        cute::GMMA::Major::K, cute::GMMA::Major::K>());
using TiledMma = decltype(cute::make_tiled_mma(
    MmaAtom{}, cute::Layout<cute::Shape<cute::Int<kConsumerWarpgroups>, cute::_1, cute::_1>>{}));
static_assert(cute::size(TiledMma{}) == kConsumerWarpgroups * kWarpgroupThreads);

// The epilogues index the accumulator fragment directly. Pin the layout they assume (CuTe's
// SM90 64xN fp32 accumulator): value i = v0 + 2*v1 + 4*t of a thread (warp w, lane l of its
// warpgroup) is element (row 16w + l/4 + 8*v1, column 8t + 2*(l%4) + v0) of the warpgroup's
// 64 x kBlockN slice.
static_assert(
    std::is_same_v<typename cute::MMA_Traits<MmaAtom>::CLayout, cute::GMMA::CLayout_64xN<kBlockN>>);
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

// Launch parameters (one struct, passed as a __grid_constant__ so the TMA descriptors stay in
// parameter space where the TMA unit can read them).
struct Params {
  CUtensorMap a;        // [row_capacity][K] bf16, box 64 x 128
  CUtensorMap b;        // [L][N][K] bf16, box 64 x 256 x 1
  CUtensorMap out;      // main output [row_capacity][out_cols], box 64 x 64
  CUtensorMap out_aux;  // SwiGLU kernel: gate_up [row_capacity][2I], box 64 x 64 (if stored)
  const int32_t* expert_offset;
  const int32_t* expert_count;  // may be null
  int num_experts;
  int capacity_blocks;  // row_capacity / kBlockM
  int n_blocks;         // ceil(N / kBlockN)
  int k_tiles;          // K / kBlockK
  int out_cols;         // columns of `out`
  int aux_cols;         // columns of `out_aux`
  bool store_aux;
};

}  // namespace caracal::kernels::gemm
