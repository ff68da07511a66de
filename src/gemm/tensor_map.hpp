#pragma once
// Host-side TMA descriptors for row-major tensors: operands and outputs (bf16, e4m3, fp32) with the
// 128-byte swizzle the grouped-GEMM kernels' shared-memory layouts use, and the FP8 operands' fp32
// scales unswizzled (read as plain arrays). The driver entry point is looked up through the
// runtime, so nothing links libcuda directly.
#include <cuda.h>

#include <cstdint>

#include "caracal/gemm/grouped_gemm.hpp"

namespace caracal::gemm {

// The element of a swizzled map.
enum class TensorElement { kBf16, kE4m3 };

// [rows][cols] elements (cols contiguous), copied in boxes of box_rows x box_cols (box_cols
// elements must be 128 bytes for the swizzle). Coordinates are (col, row). Throws caracal::Error
// naming `what`.
CUtensorMap make_tensor_map_2d(const void* base, uint64_t rows, uint64_t cols, uint32_t box_rows,
                               uint32_t box_cols, const char* what, TensorElement element = TensorElement::kBf16);

// The same for fp32 elements (box_cols * 4 must be 128 bytes).
CUtensorMap make_f32_tensor_map_2d(const void* base, uint64_t rows, uint64_t cols, uint32_t box_rows,
                                   uint32_t box_cols, const char* what);

// [batch][rows][cols], boxes of 1 x box_rows x box_cols; coordinates (col, row, batch).
CUtensorMap make_tensor_map_3d(const void* base, uint64_t batch, uint64_t rows, uint64_t cols,
                               uint32_t box_rows, uint32_t box_cols, const char* what,
                               TensorElement element = TensorElement::kBf16);

// The experts' gate/up weights or their gradients, [L][2I][cols] (cols contiguous) in either order
// of their 2I rows, as one 5-D view whose box of box_groups x 16 rows is in Caracal's interleaved
// order (caracal/gemm/grouped_gemm.hpp, gate_up_row: groups of 8 gate rows, then their 8 up rows),
// whichever order memory holds, for loads and stores alike: dims (col, r, h, q, expert), row
// (q, h, r) of the interleaved order found at 16 q + 8 h + r (GateUpLayout::kInterleaved) or
// h I + 8 q + r (kHalves). Coordinates (col, 0, 0, first row / 16, expert). I a multiple of 8;
// throws caracal::Error naming `what`.
CUtensorMap make_gate_up_view_map(const void* base, uint64_t experts, uint64_t intermediate, uint64_t cols,
                                  GateUpLayout layout, uint32_t box_groups, uint32_t box_cols, const char* what);
// The same view of an fp32 [L][2I][cols] (the gate/up weight gradients; box_cols * 4 = 128 bytes).
CUtensorMap make_f32_gate_up_view_map(const void* base, uint64_t experts, uint64_t intermediate, uint64_t cols,
                                      GateUpLayout layout, uint32_t box_groups, uint32_t box_cols, const char* what);

// fp32 scales, unswizzled: [rows][cols] in boxes of 1 x box_cols, and [batch][rows][cols] in boxes
// of 1 x 1 x box_cols (box_cols * 4 a multiple of 16 bytes, as the rows' strides must be).
CUtensorMap make_scale_map_2d(const void* base, uint64_t rows, uint64_t cols, uint32_t box_cols, const char* what);
CUtensorMap make_scale_map_3d(const void* base, uint64_t batch, uint64_t rows, uint64_t cols, uint32_t box_cols,
                              const char* what);

}  // namespace caracal::gemm
