#pragma once
// Shared-memory operand layouts and the tiled wgmma of a policy (gemm_policy.cuh) for a pair of
// operand majornesses.
//
// K-major: the operand is [MN][K] in memory (K contiguous), loaded as (rows x BlockK) TMA boxes of
// 128-byte K rows. MN-major: the operand is [K][MN] (MN contiguous), loaded as BlockK x kMnBox
// boxes, each one BlockK rows of a 128-byte MN row; the boxes of one stage are stacked along MN, so
// an MN block of kMnBox owns all BlockK rows (CuTe's Step<_2,_1,_3>: K tiled first). Both are
// CuTe's canonical 128B-swizzle GMMA layouts, the swizzle CU_TENSOR_MAP_SWIZZLE_128B writes, and
// wgmma reads either majorness of 16-bit operands straight from shared memory (8-bit ones only
// K-major).
#include <type_traits>

#include <cute/tensor.hpp>

#include "device/gemm/gemm_config.cuh"
#include "device/gemm/gemm_policy.cuh"

namespace caracal::gemm {

// (rows, BlockK, stage) tiles of an operand (an OperandTile of gemm_policy.cuh).
template <Major kMajor, class Operand, int Stages>
struct OperandSmemLayout;

template <class Operand, int Stages>
struct OperandSmemLayout<Major::K, Operand, Stages> {
  using type = decltype(cute::tile_to_shape(
      cute::GMMA::Layout_K_SW128_Atom<typename Operand::Element>{},
      cute::make_shape(cute::Int<Operand::kRows>{}, cute::Int<Operand::kBlockK>{}, cute::Int<Stages>{})));
};

template <class Operand, int Stages>
struct OperandSmemLayout<Major::MN, Operand, Stages> {
  using type = decltype(cute::tile_to_shape(
      cute::GMMA::Layout_MN_SW128_Atom<typename Operand::Element>{},
      cute::make_shape(cute::Int<Operand::kRows>{}, cute::Int<Operand::kBlockK>{}, cute::Int<Stages>{}),
      cute::Step<cute::_2, cute::_1, cute::_3>{}));
};

template <class Policy, Major kMajorA, Major kMajorB>
struct MmaConfig {
  using SmemLayoutA = typename OperandSmemLayout<kMajorA, typename Policy::A, Policy::kStages>::type;
  using SmemLayoutB = typename OperandSmemLayout<kMajorB, typename Policy::B, Policy::kStages>::type;

  // Two consumer warpgroups stacked along M, each issuing 64 x kMmaN x kMmaK wgmma (kBlockN / kMmaN
  // of them across the tile's N).
  using MmaAtom = decltype(cute::GMMA::ss_op_selector<
                           typename Policy::ElementA, typename Policy::ElementB, typename Policy::Accumulator,
                           cute::Shape<cute::_64, cute::Int<Policy::kMmaN>, cute::Int<Policy::kMmaK>>, kMajorA,
                           kMajorB>());
  using TiledMma = decltype(cute::make_tiled_mma(
      MmaAtom{}, cute::Layout<cute::Shape<cute::Int<kConsumerWarpgroups>, cute::_1, cute::_1>>{}));
  static_assert(cute::size(TiledMma{}) == kConsumerWarpgroups * kWarpgroupThreads);

  // The accumulator layout the epilogues and the block-scaled promotion index (gemm_config.cuh)
  // does not depend on majorness or precision; pin it here, where the atom is chosen. kBlockN /
  // kMmaN atoms along N index as one 64 x kBlockN atom would: value i of slice n is value
  // i + n * kMmaN / 2 of the tile, column 8t + n * kMmaN + ... = 8(t + n * kMmaN / 8) + ....
  static_assert(std::is_same_v<typename cute::MMA_Traits<MmaAtom>::CLayout,
                               cute::GMMA::CLayout_64xN<Policy::kMmaN>>);
};

// A Gemm's (expert_gemms/): its policy's, for its operands' majorness.
template <class Gemm>
using MmaConfigOf = MmaConfig<typename Gemm::Policy, Gemm::OperandA::kMajor, Gemm::OperandB::kMajor>;

}  // namespace caracal::gemm
