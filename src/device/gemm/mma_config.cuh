#pragma once
// Shared-memory operand layouts and the tiled wgmma for a pair of operand majornesses.
//
// K-major: the operand is [MN][K] in memory (K contiguous), loaded as (rows x 64) TMA boxes of
// 128-byte K rows. MN-major: the operand is [K][MN] (MN contiguous), loaded as 64 x 64 boxes,
// each one 64 K rows of 64 MN elements; the boxes of one stage are stacked along MN, so an MN
// block of 64 owns 8 KiB holding all 64 K rows (CuTe's Step<_2,_1,_3>: K tiled first). Both are
// CuTe's canonical 128B-swizzle GMMA layouts, the swizzle CU_TENSOR_MAP_SWIZZLE_128B writes, and
// wgmma reads either majorness of 16-bit operands straight from shared memory.
#include <type_traits>

#include <cute/tensor.hpp>

#include "device/gemm/gemm_config.cuh"

namespace caracal::gemm {

// (rows, 64, stage) operand tiles of `Rows` MN rows.
template <Major kMajor, int Rows>
struct OperandSmemLayout;

template <int Rows>
struct OperandSmemLayout<Major::K, Rows> {
  using type = decltype(cute::tile_to_shape(
      cute::GMMA::Layout_K_SW128_Atom<Element>{},
      cute::make_shape(cute::Int<Rows>{}, cute::Int<kBlockK>{}, cute::Int<kStages>{})));
};

template <int Rows>
struct OperandSmemLayout<Major::MN, Rows> {
  using type = decltype(cute::tile_to_shape(
      cute::GMMA::Layout_MN_SW128_Atom<Element>{},
      cute::make_shape(cute::Int<Rows>{}, cute::Int<kBlockK>{}, cute::Int<kStages>{}),
      cute::Step<cute::_2, cute::_1, cute::_3>{}));
};

template <Major kMajorA, Major kMajorB>
struct MmaConfig {
  using SmemLayoutA = typename OperandSmemLayout<kMajorA, kBlockM>::type;
  using SmemLayoutB = typename OperandSmemLayout<kMajorB, kBlockN>::type;

  // Two consumer warpgroups stacked along M, each issuing 64 x kBlockN x 16 wgmma.
  using MmaAtom = decltype(cute::GMMA::ss_op_selector<
                           Element, Element, float,
                           cute::Shape<cute::_64, cute::Int<kBlockN>, cute::_16>, kMajorA, kMajorB>());
  using TiledMma = decltype(cute::make_tiled_mma(
      MmaAtom{}, cute::Layout<cute::Shape<cute::Int<kConsumerWarpgroups>, cute::_1, cute::_1>>{}));
  static_assert(cute::size(TiledMma{}) == kConsumerWarpgroups * kWarpgroupThreads);

  // The accumulator layout the epilogues index (gemm_config.cuh) does not depend on majorness;
  // pin it here, where the atom is chosen.
  static_assert(std::is_same_v<typename cute::MMA_Traits<MmaAtom>::CLayout,
                               cute::GMMA::CLayout_64xN<kBlockN>>);
};

}  // namespace caracal::gemm
