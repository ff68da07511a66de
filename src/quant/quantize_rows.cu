// quantize_rows (quantize_fp8.hpp): one warp a (row, 1 x 128 block), four values a lane; each warp
// loads its consecutive blocks (kWholeItemsPerWarp where rows are whole blocks, else kItemsPerWarp)
// before it quantizes any, so that enough bytes are in flight to keep HBM busy (one block at a
// time left each warp waiting on one 256-byte load: ~40% of HBM).
#include <algorithm>

#include "caracal/comm/cuda_check.hpp"
#include "caracal/error.hpp"
#include "quant/block_scale.cuh"
#include "quant/operand_checks.hpp"
#include "quant/quantize_fp8.hpp"

namespace caracal::quant {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kItemsPerWarp = 4;         // any row length
constexpr int kWholeItemsPerWarp = 8;    // rows of whole blocks
constexpr int kCtasPerSm = 8;  // 2,048 threads an SM
constexpr int kSms = 132;      // H100 and H200; fewer SMs only queue CTAs

// Item `item` (block `block` of row `row`), its four values of this lane loaded as `packed`: its
// codes and (lane 0) its scale stored.
__device__ __forceinline__ void quantize_item(const QuantizeRowsArgs& args, int64_t row, int64_t block, int lane,
                                              uint2 packed) {
  const int64_t col = block * kFp8Block + lane * 4;
  const float2 low = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&packed.x));
  const float2 high = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&packed.y));
  const float v[4] = {low.x, low.y, high.x, high.y};
  float amax = 0.0f;
  for (float x : v) amax = fmaxf(amax, fabsf(x));
  const BlockScale s = device_block_scale(warp_max(amax), args.rounding);
  if (col < args.cols) {
    const uint32_t codes =
        uint32_t(e4m3_code_pair(v[0], v[1], s.inverse)) | uint32_t(e4m3_code_pair(v[2], v[3], s.inverse)) << 16;
    *reinterpret_cast<uint32_t*>(args.codes + row * args.cols + col) = codes;
  }
  if (lane == 0) args.scales[row * args.scale_row_stride + block * args.scale_block_stride] = s.scale;
}

// Rows of whole blocks (cols % 128 == 0): item i is elements [128 i, 128 i + 128) of the values and
// the codes, so a warp's items are one run of memory; twice the items in flight.
__device__ __forceinline__ void quantize_whole_blocks(const QuantizeRowsArgs& args, int64_t warp, int lane) {
  const int64_t blocks_per_row = args.cols / kFp8Block;
  const int64_t items = args.rows * blocks_per_row;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kWarps * kWholeItemsPerWarp;
  for (int64_t first = warp * kWholeItemsPerWarp; first < items; first += stride) {
    const __nv_bfloat16* from = args.values + first * kFp8Block + lane * 4;
    uint2 packed[kWholeItemsPerWarp];
    for (int u = 0; u < kWholeItemsPerWarp; ++u) {
      packed[u] = first + u < items ? *reinterpret_cast<const uint2*>(from + u * kFp8Block) : make_uint2(0, 0);
    }
    int64_t row = first / blocks_per_row, block = first % blocks_per_row;
    for (int u = 0; u < kWholeItemsPerWarp; ++u) {
      if (first + u >= items) break;  // the same for every lane of the warp
      quantize_item(args, row, block, lane, packed[u]);
      if (++block == blocks_per_row) block = 0, ++row;
    }
  }
}

// Any row length (cols % 4 == 0): the last block of a row may be partial.
__device__ __forceinline__ void quantize_any_blocks(const QuantizeRowsArgs& args, int64_t warp, int lane) {
  const int64_t blocks_per_row = (args.cols + kFp8Block - 1) / kFp8Block;
  const int64_t items = args.rows * blocks_per_row;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kWarps * kItemsPerWarp;
  for (int64_t first = warp * kItemsPerWarp; first < items; first += stride) {
    // The warp's consecutive items: block `block` of row `row`, then the next blocks, across rows.
    int64_t rows[kItemsPerWarp], blocks[kItemsPerWarp];
    int64_t row = first / blocks_per_row, block = first % blocks_per_row;
    uint2 packed[kItemsPerWarp];
    for (int u = 0; u < kItemsPerWarp; ++u) {
      rows[u] = row;
      blocks[u] = block;
      const int64_t col = block * kFp8Block + lane * 4;
      // cols % 4 == 0: a lane's four values are all in the row or all out.
      packed[u] = first + u < items && col < args.cols
                      ? *reinterpret_cast<const uint2*>(args.values + row * args.cols + col)
                      : make_uint2(0, 0);
      if (++block == blocks_per_row) block = 0, ++row;
    }
    for (int u = 0; u < kItemsPerWarp; ++u) {
      if (first + u >= items) break;  // the same for every lane of the warp
      quantize_item(args, rows[u], blocks[u], lane, packed[u]);
    }
  }
}

__global__ void __launch_bounds__(kThreads) quantize_rows_kernel(const QuantizeRowsArgs args) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t warp = static_cast<int64_t>(blockIdx.x) * kWarps + static_cast<int>(threadIdx.x) / 32;
  if (args.cols % kFp8Block == 0) {
    quantize_whole_blocks(args, warp, lane);
  } else {
    quantize_any_blocks(args, warp, lane);
  }
}

}  // namespace

void quantize_rows(const QuantizeRowsArgs& args, cudaStream_t stream) {
  constexpr const char* kWhere = "quant::quantize_rows";
  CARACAL_CHECK(args.rows >= 0, kWhere, ": rows must be non-negative, got ", args.rows);
  CARACAL_CHECK(args.cols > 0 && args.cols % 4 == 0, kWhere, ": cols must be a positive multiple of 4, got ",
                args.cols);
  if (args.rows == 0) return;
  check_operands(kWhere, {{args.values, "values", 8}, {args.codes, "codes", 4}, {args.scales, "scales", 1}});
  CARACAL_CHECK(args.scale_row_stride > 0 && args.scale_block_stride > 0, kWhere,
                ": scale_row_stride and scale_block_stride must be positive, got ", args.scale_row_stride, " and ",
                args.scale_block_stride);
  const int64_t items = args.rows * ((args.cols + kFp8Block - 1) / kFp8Block);
  const int64_t per_cta = int64_t(kWarps) * (args.cols % kFp8Block == 0 ? kWholeItemsPerWarp : kItemsPerWarp);
  const int grid = static_cast<int>(std::min<int64_t>((items + per_cta - 1) / per_cta, int64_t(kCtasPerSm) * kSms));
  quantize_rows_kernel<<<grid, kThreads, 0, stream>>>(args);
  check_cuda(cudaGetLastError(), "quantize_rows_kernel launch");
}

}  // namespace caracal::quant
