// quantize_weights (quantize_fp8.hpp): one CTA a 128 x 128 block of one expert's [n][k] weights;
// the transposed codes go through shared memory.
#include <algorithm>
#include <climits>

#include "caracal/comm/cuda_check.hpp"
#include "caracal/error.hpp"
#include "quant/block_scale.cuh"
#include "quant/quantize_fp8.hpp"

namespace caracal::quant {
namespace {

constexpr int kThreads = 256;
constexpr int kBlock = static_cast<int>(kFp8Block);
constexpr int kColumnThreads = kBlock / 8;                // a thread's 8 columns: one 16-byte load
constexpr int kRowsPerPass = kThreads / kColumnThreads;  // 16
constexpr int kTilePitch = kBlock + 8;                   // bytes per row of the transposing tile (8-byte stores)

__global__ void __launch_bounds__(kThreads) quantize_weights_kernel(const QuantizeWeightsArgs args) {
  __shared__ float warp_amax[kThreads / 32];
  __shared__ alignas(16) uint8_t tile[kBlock][kTilePitch];
  const int64_t n_blocks = weight_blocks(args.n), k_blocks = weight_blocks(args.k);
  const int64_t flat = blockIdx.x;
  const int64_t expert = flat / (n_blocks * k_blocks);
  const int64_t nb = flat / k_blocks % n_blocks, kb = flat % k_blocks;
  const int thread = static_cast<int>(threadIdx.x);
  const int col = thread % kColumnThreads * 8;
  const int rows_here = static_cast<int>(std::min<int64_t>(kBlock, args.n - nb * kBlock));
  const int cols_here = static_cast<int>(std::min<int64_t>(kBlock, args.k - kb * kBlock));  // multiples of 8
  const __nv_bfloat16* const block = args.weights + (expert * args.n + nb * kBlock) * args.k + kb * kBlock;

  float v[kBlock / kRowsPerPass][8];
  float amax = 0.0f;
  for (int i = 0; i < kBlock / kRowsPerPass; ++i) {
    const int row = thread / kColumnThreads + i * kRowsPerPass;
    uint4 packed = make_uint4(0, 0, 0, 0);
    if (row < rows_here && col < cols_here) packed = *reinterpret_cast<const uint4*>(block + row * args.k + col);
    const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&packed);
    for (int j = 0; j < 4; ++j) {
      const float2 f = __bfloat1622float2(pairs[j]);
      v[i][2 * j] = f.x, v[i][2 * j + 1] = f.y;
      amax = fmaxf(amax, fmaxf(fabsf(f.x), fabsf(f.y)));
    }
  }
  amax = warp_max(amax);
  if (thread % 32 == 0) warp_amax[thread / 32] = amax;
  __syncthreads();
  amax = 0.0f;
  for (float a : warp_amax) amax = fmaxf(amax, a);
  const BlockScale s = device_block_scale(amax, args.rounding);

  for (int i = 0; i < kBlock / kRowsPerPass; ++i) {
    const int row = thread / kColumnThreads + i * kRowsPerPass;
    uint2 codes = make_uint2(0, 0);
    for (int j = 0; j < 8; ++j) {
      const uint32_t code = e4m3_code(v[i][j], s.inverse);
      (j < 4 ? codes.x : codes.y) |= code << (8 * (j % 4));
    }
    *reinterpret_cast<uint2*>(&tile[row][col]) = codes;
    if (args.codes != nullptr && row < rows_here && col < cols_here) {
      *reinterpret_cast<uint2*>(args.codes + (expert * args.n + nb * kBlock + row) * args.k + kb * kBlock + col) = codes;
    }
  }
  if (thread == 0) {
    if (args.scales != nullptr) args.scales[(expert * k_blocks + kb) * weight_scale_row(n_blocks) + nb] = s.scale;
    if (args.scales_t != nullptr) args.scales_t[(expert * n_blocks + nb) * weight_scale_row(k_blocks) + kb] = s.scale;
  }
  if (args.codes_t == nullptr) return;
  __syncthreads();
  // Row `column` of the transposed block, half of it a thread, four codes a store.
  const int column = thread / 2;
  if (column >= cols_here) return;
  for (int row = thread % 2 * (kBlock / 2); row < (thread % 2 + 1) * (kBlock / 2) && row < rows_here; row += 4) {
    uint32_t codes = 0;
    for (int j = 0; j < 4; ++j) codes |= static_cast<uint32_t>(tile[row + j][column]) << (8 * j);
    *reinterpret_cast<uint32_t*>(args.codes_t + (expert * args.k + kb * kBlock + column) * args.n + nb * kBlock + row) =
        codes;
  }
}

}  // namespace

void quantize_weights(const QuantizeWeightsArgs& args, cudaStream_t stream) {
  constexpr const char* kWhere = "quant::quantize_weights";
  CARACAL_CHECK(args.experts >= 0, kWhere, ": experts must be non-negative, got ", args.experts);
  CARACAL_CHECK(args.n > 0 && args.n % 8 == 0, kWhere, ": n must be a positive multiple of 8, got ", args.n);
  CARACAL_CHECK(args.k > 0 && args.k % 8 == 0, kWhere, ": k must be a positive multiple of 8, got ", args.k);
  if (args.experts == 0) return;
  CARACAL_CHECK(args.weights != nullptr, kWhere, ": weights must not be null");
  CARACAL_CHECK(reinterpret_cast<uintptr_t>(args.weights) % 16 == 0, kWhere, ": weights must be 16-byte aligned");
  CARACAL_CHECK((args.codes == nullptr) == (args.scales == nullptr), kWhere,
                ": codes and scales must both be given or both be null");
  CARACAL_CHECK((args.codes_t == nullptr) == (args.scales_t == nullptr), kWhere,
                ": codes_t and scales_t must both be given or both be null");
  CARACAL_CHECK(args.codes != nullptr || args.codes_t != nullptr, kWhere,
                ": at least one of codes and codes_t must be given");
  CARACAL_CHECK(reinterpret_cast<uintptr_t>(args.codes) % 8 == 0, kWhere, ": codes must be 8-byte aligned");
  CARACAL_CHECK(reinterpret_cast<uintptr_t>(args.codes_t) % 4 == 0, kWhere, ": codes_t must be 4-byte aligned");
  const int64_t blocks = args.experts * weight_blocks(args.n) * weight_blocks(args.k);
  CARACAL_CHECK(blocks <= INT_MAX, kWhere, ": experts * blocks(n) * blocks(k) must be below 2^31, got ", blocks);
  quantize_weights_kernel<<<static_cast<int>(blocks), kThreads, 0, stream>>>(args);
  check_cuda(cudaGetLastError(), "quantize_weights_kernel launch");
}

}  // namespace caracal::quant
