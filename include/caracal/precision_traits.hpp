#pragma once
// The element type of a precision's rows (caracal/row_format.hpp sizes them), for code that types
// buffers: PrecisionTraits<P>::Row and ::kRowFormat. LayerRow is the one the layer's buffers of
// such rows are typed with (the exchange's x, expert_x, dy, expert_dy; the experts' x, activation
// and dy): bf16, the precision the layer runs (src/layer/layer_sizes.cpp refuses the others). The
// public API's inputs, outputs and weights are bf16 in any precision.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstddef>

#include "caracal/layer_config.hpp"
#include "caracal/row_format.hpp"

namespace caracal {

template <Precision P>
struct PrecisionTraits;

template <>
struct PrecisionTraits<Precision::kBF16> {
  using Row = __nv_bfloat16;
  static constexpr RowFormat kRowFormat = row_format(Precision::kBF16);
};

template <>
struct PrecisionTraits<Precision::kFP8> {
  using Row = __nv_fp8_e4m3;  // its scales: fp32, kRowFormat.scale_block values each
  static constexpr RowFormat kRowFormat = row_format(Precision::kFP8);
};

template <Precision P>
inline constexpr bool kRowTypeMatchesFormat = sizeof(typename PrecisionTraits<P>::Row) ==
                                              static_cast<size_t>(PrecisionTraits<P>::kRowFormat.element_bytes);
static_assert(kRowTypeMatchesFormat<Precision::kBF16> && kRowTypeMatchesFormat<Precision::kFP8>);

using LayerRow = PrecisionTraits<Precision::kBF16>::Row;

}  // namespace caracal
