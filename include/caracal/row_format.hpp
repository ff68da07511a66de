#pragma once
// How a precision (caracal/layer_config.hpp) stores what the layer moves and multiplies: rows (x,
// dy, the activation: what the exchange pulls, the ring holds and the GEMMs read as A) as values
// and, where scaled, one fp32 per block of values along the row; weight matrices likewise, per
// block of rows and columns. The one place that sizes them (the exchange's heap, the layer's local
// buffers, the planner); their element types are caracal/precision_traits.hpp's. Host only.
#include <cstdint>

#include "caracal/layer_config.hpp"

namespace caracal {

// Values per fp32 scale along a row, and rows and columns per fp32 scale of a weight matrix, in a
// scaled precision (DeepSeek-V3's 1 x 128 and 128 x 128 blocks).
inline constexpr int64_t kPrecisionScaleBlock = 128;

struct RowFormat {
  int64_t element_bytes = 2;  // per value
  int64_t scale_block = 0;    // values per fp32 scale; 0: unscaled

  constexpr int64_t value_bytes(int64_t cols) const { return cols * element_bytes; }
  constexpr int64_t scale_bytes(int64_t cols) const {
    return scale_block > 0 ? (cols + scale_block - 1) / scale_block * 4 : 0;
  }
  // What one row of `cols` values takes: in a buffer, across NVLink, in the ring.
  constexpr int64_t row_bytes(int64_t cols) const { return value_bytes(cols) + scale_bytes(cols); }
};

// bf16: 2-byte values, unscaled. fp8: 1-byte e4m3 values, one fp32 scale per 1 x 128 block.
constexpr RowFormat row_format(Precision precision) {
  return precision == Precision::kFP8 ? RowFormat{1, kPrecisionScaleBlock} : RowFormat{2, 0};
}

// Bytes of a [rows x cols] weight matrix: its values, and for fp8 one fp32 scale per 128 x 128 block.
constexpr int64_t weight_bytes(int64_t rows, int64_t cols, Precision precision) {
  const RowFormat f = row_format(precision);
  const int64_t blocks = f.scale_block > 0 ? (rows + f.scale_block - 1) / f.scale_block *
                                                 ((cols + f.scale_block - 1) / f.scale_block)
                                           : 0;
  return rows * f.value_bytes(cols) + blocks * 4;
}

}  // namespace caracal
