#pragma once
// Host-side TMA descriptors for row-major bf16 (and fp32) tensors, all with the 128-byte swizzle the
// grouped-GEMM kernels' shared-memory layouts use. The driver entry point is looked up through
// the runtime, so nothing links libcuda directly.
#include <cuda.h>

#include <cstdint>

namespace caracal::gemm {

// [rows][cols] bf16 (cols contiguous), copied in boxes of box_rows x box_cols (box_cols * 2 must
// be 128 bytes for the swizzle). Coordinates are (col, row). Throws caracal::Error naming `what`.
CUtensorMap make_tensor_map_2d(const void* base, uint64_t rows, uint64_t cols, uint32_t box_rows,
                               uint32_t box_cols, const char* what);

// The same for fp32 elements (box_cols * 4 must be 128 bytes).
CUtensorMap make_f32_tensor_map_2d(const void* base, uint64_t rows, uint64_t cols, uint32_t box_rows,
                                   uint32_t box_cols, const char* what);

// [batch][rows][cols] bf16, boxes of 1 x box_rows x box_cols; coordinates (col, row, batch).
CUtensorMap make_tensor_map_3d(const void* base, uint64_t batch, uint64_t rows, uint64_t cols,
                               uint32_t box_rows, uint32_t box_cols, const char* what);

}  // namespace caracal::gemm
