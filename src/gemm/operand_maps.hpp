#pragma once
// The host half of the operand kinds (device/gemm/operand_loads.cuh): each kind's TMA map of its
// tensor and, for a scaled operand, of its scales, boxes as the kind's loads copy them (the tile's
// element, 128-byte swizzle; scales unswizzled). OperandMaps<Kind>::make_map<Tile>(...).
#include <cstdint>
#include <type_traits>

#include "caracal/gemm/grouped_gemm_fp8.hpp"
#include "device/gemm/operand_loads.cuh"
#include "gemm/tensor_map.hpp"

namespace caracal::gemm {

// The element of a tile's swizzled map.
template <class Tile>
constexpr TensorElement tensor_element() {
  using Element = typename Tile::Element;
  static_assert(std::is_same_v<Element, cute::bfloat16_t> || std::is_same_v<Element, cute::float_e4m3_t>,
                "bf16 or e4m3 operands");
  return std::is_same_v<Element, cute::float_e4m3_t> ? TensorElement::kE4m3 : TensorElement::kBf16;
}

template <class Kind>
struct OperandMaps;

template <>
struct OperandMaps<KMajorRows> {
  template <class Tile>
  static CUtensorMap make_map(const void* base, uint64_t rows, uint64_t k, const char* what) {
    return make_tensor_map_2d(base, rows, k, Tile::kRows, Tile::kBlockK, what, tensor_element<Tile>());
  }
  // Scales [ceil(K / 128)][rows], rows contiguous (rows a multiple of 4).
  template <class Tile>
  static CUtensorMap make_scale_map(const float* scales, uint64_t rows, uint64_t k, const char* what) {
    static_assert(Tile::kScale == ScaleKind::kPerRowBlock, "rows scaled per 1 x 128 block");
    return make_scale_map_2d(scales, (k + kScaleBlock - 1) / kScaleBlock, rows, uint32_t(ScaleTile<Tile>::kCount),
                             what);
  }
};

template <>
struct OperandMaps<KMajorWeights> {
  template <class Tile>
  static CUtensorMap make_map(const void* base, uint64_t experts, uint64_t n, uint64_t k,
                              const char* what) {
    return make_tensor_map_3d(base, experts, n, k, Tile::kRows, Tile::kBlockK, what, tensor_element<Tile>());
  }
  // Scales [L][ceil(K / 128)][fp8_weight_scale_row(ceil(N / 128))], read in boxes of a row's
  // kBlockScaleBox floats.
  template <class Tile>
  static CUtensorMap make_scale_map(const float* scales, uint64_t experts, uint64_t n, uint64_t k,
                                    const char* what) {
    static_assert(Tile::kScale == ScaleKind::kPerBlock, "weights scaled per 128 x 128 block");
    static_assert(fp8_weight_scale_row(1) == kBlockScaleBox, "a scale row holds whole boxes");
    uint64_t const n_blocks = (n + kScaleBlock - 1) / kScaleBlock;
    return make_scale_map_3d(scales, experts, (k + kScaleBlock - 1) / kScaleBlock,
                             uint64_t(fp8_weight_scale_row(int64_t(n_blocks))), kBlockScaleBox, what);
  }
};

template <>
struct OperandMaps<KMajorGateUpWeights> {
  // W_gate_up [L][n = 2I][k], its rows interleaved or in [gate; up] halves.
  template <class Tile>
  static CUtensorMap make_map(const void* base, uint64_t experts, uint64_t n, uint64_t k, const char* what,
                              GateUpLayout layout = GateUpLayout::kInterleaved) {
    static_assert(std::is_same_v<typename Tile::Element, cute::bfloat16_t>, "the gate/up view: bf16 weights");
    return make_gate_up_view_map(base, experts, n / 2, k, layout, Tile::kRows / KMajorGateUpWeights::kGroupRows,
                                 Tile::kBlockK, what);
  }
};

template <>
struct OperandMaps<MNMajorGateUpWeights> {
  // W_gate_up [L][k = 2I][n], its rows interleaved or in [gate; up] halves.
  template <class Tile>
  static CUtensorMap make_map(const void* base, uint64_t experts, uint64_t k, uint64_t n, const char* what,
                              GateUpLayout layout = GateUpLayout::kInterleaved) {
    static_assert(std::is_same_v<typename Tile::Element, cute::bfloat16_t>, "the gate/up view: bf16 weights");
    return make_gate_up_view_map(base, experts, k / 2, n, layout, Tile::kBlockK / MNMajorGateUpWeights::kGroupRows,
                                 Tile::kMnBox, what);
  }
};

template <>
struct OperandMaps<MNMajorWeights> {
  template <class Tile>
  static CUtensorMap make_map(const void* base, uint64_t experts, uint64_t k, uint64_t n,
                              const char* what) {
    static_assert(std::is_same_v<typename Tile::Element, cute::bfloat16_t>, "MN-major: bf16 operands only");
    return make_tensor_map_3d(base, experts, k, n, Tile::kBlockK, Tile::kMnBox, what);
  }
};

template <>
struct OperandMaps<MNMajorRows> {
  template <class Tile>
  static CUtensorMap make_map(const void* base, uint64_t rows, uint64_t mn, const char* what) {
    static_assert(std::is_same_v<typename Tile::Element, cute::bfloat16_t>, "MN-major: bf16 operands only");
    return make_tensor_map_2d(base, rows, mn, Tile::kBlockK, Tile::kMnBox, what);
  }
};

}  // namespace caracal::gemm
