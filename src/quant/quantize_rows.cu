// quantize_rows (quantize_fp8.hpp): one warp a (row, 1 x 128 block), four values a lane.
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

__global__ void __launch_bounds__(kThreads) quantize_rows_kernel(const QuantizeRowsArgs args) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t blocks_per_row = (args.cols + kFp8Block - 1) / kFp8Block;
  const int64_t items = args.rows * blocks_per_row;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kWarps + static_cast<int>(threadIdx.x) / 32;
  for (int64_t item = first; item < items; item += static_cast<int64_t>(gridDim.x) * kWarps) {
    const int64_t row = item / blocks_per_row, block = item % blocks_per_row;
    const int64_t col = block * kFp8Block + lane * 4;
    const bool in_row = col < args.cols;  // cols % 4 == 0: a lane's four values are all in or all out
    float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (in_row) {
      const uint2 packed = *reinterpret_cast<const uint2*>(args.values + row * args.cols + col);
      const float2 low = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&packed.x));
      const float2 high = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&packed.y));
      v[0] = low.x, v[1] = low.y, v[2] = high.x, v[3] = high.y;
    }
    float amax = 0.0f;
    for (float x : v) amax = fmaxf(amax, fabsf(x));
    const BlockScale s = device_block_scale(warp_max(amax), args.rounding);
    if (in_row) {
      uint32_t codes = 0;
      for (int i = 0; i < 4; ++i) codes |= static_cast<uint32_t>(e4m3_code(v[i], s.inverse)) << (8 * i);
      *reinterpret_cast<uint32_t*>(args.codes + row * args.cols + col) = codes;
    }
    if (lane == 0) args.scales[row * args.scale_row_stride + block * args.scale_block_stride] = s.scale;
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
  const int grid = static_cast<int>(std::min<int64_t>((items + kWarps - 1) / kWarps, 4 * 132));
  quantize_rows_kernel<<<grid, kThreads, 0, stream>>>(args);
  check_cuda(cudaGetLastError(), "quantize_rows_kernel launch");
}

}  // namespace caracal::quant
