// quantize_weights (quantize_fp8.hpp): one CTA a 128 x 128 block of one expert's [n][k] weights,
// a thread an 8 x 8 square of it (square_tile.cuh); shared memory holds the warps' amax only.
#include <climits>

#include "caracal/comm/cuda_check.hpp"
#include "caracal/error.hpp"
#include "quant/block_scale.cuh"
#include "quant/operand_checks.hpp"
#include "quant/quantize_fp8.hpp"
#include "quant/square_tile.cuh"

namespace caracal::quant {
namespace {

constexpr int kThreads = kSquareThreads;
constexpr int kSide = static_cast<int>(kFp8Block);

__global__ void __launch_bounds__(kThreads) quantize_weights_kernel(const QuantizeWeightsArgs args) {
  __shared__ float warp_amax[kThreads / 32];
  const int64_t n_blocks = weight_blocks(args.n), k_blocks = weight_blocks(args.k);
  const int64_t flat = blockIdx.x;
  const int64_t expert = flat / (n_blocks * k_blocks);
  const int64_t nb = flat / k_blocks % n_blocks, kb = flat % k_blocks;
  const int thread = static_cast<int>(threadIdx.x), lane = thread % 32, warp = thread / 32;
  const int row0 = square_row0(thread), col0 = square_col0(thread);
  // n and k are multiples of 8: a square lies wholly inside the matrix or wholly outside it.
  const bool inside = nb * kSide + row0 < args.n && kb * kSide + col0 < args.k;

  uint4 raw[kSquare];  // row r of the square: 8 bf16
  const __nv_bfloat16* first = args.weights + (expert * args.n + nb * kSide + row0) * args.k + kb * kSide + col0;
  for (int r = 0; r < kSquare; ++r) {
    raw[r] = inside ? *reinterpret_cast<const uint4*>(first + r * args.k) : make_uint4(0, 0, 0, 0);
  }
  float amax = 0.0f;
  for (const uint4& v : raw) {
    const uint32_t words[4] = {v.x, v.y, v.z, v.w};
    for (uint32_t pair : words) {
      const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&pair));
      amax = fmaxf(amax, fmaxf(fabsf(f.x), fabsf(f.y)));
    }
  }
  amax = warp_max(amax);
  if (lane == 0) warp_amax[warp] = amax;
  __syncthreads();
  amax = 0.0f;
  for (float a : warp_amax) amax = fmaxf(amax, a);
  const BlockScale s = device_block_scale(amax, args.rounding);

  // codes[r][h]: row r's columns 4h .. 4h+3, column c in byte c % 4.
  uint32_t codes[kSquare][2];
  for (int r = 0; r < kSquare; ++r) {
    const uint32_t pairs[4] = {raw[r].x, raw[r].y, raw[r].z, raw[r].w};
    uint16_t p[4];
    for (int j = 0; j < 4; ++j) {
      const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&pairs[j]));
      p[j] = e4m3_code_pair(f.x, f.y, s.inverse);
    }
    codes[r][0] = uint32_t(p[0]) | uint32_t(p[1]) << 16;
    codes[r][1] = uint32_t(p[2]) | uint32_t(p[3]) << 16;
  }
  if (thread == 0) {
    if (args.scales != nullptr) args.scales[(expert * k_blocks + kb) * weight_scale_row(n_blocks) + weight_scale_at(nb)] = s.scale;
    if (args.scales_t != nullptr) args.scales_t[(expert * n_blocks + nb) * weight_scale_row(k_blocks) + weight_scale_at(kb)] = s.scale;
  }
  if (!inside) return;
  if (args.codes != nullptr) {
    uint8_t* const out = reinterpret_cast<uint8_t*>(args.codes) + (expert * args.n + nb * kSide + row0) * args.k +
                         kb * kSide + col0;
    for (int r = 0; r < kSquare; ++r) *reinterpret_cast<uint2*>(out + r * args.k) = make_uint2(codes[r][0], codes[r][1]);
  }
  if (args.codes_t == nullptr) return;
  transpose_square(codes);
  uint8_t* const out_t = reinterpret_cast<uint8_t*>(args.codes_t) + (expert * args.k + kb * kSide + col0) * args.n +
                         nb * kSide + row0;
  for (int h = 0; h < 2; ++h) {
    for (int c = 0; c < 4; ++c) {
      *reinterpret_cast<uint2*>(out_t + (4 * h + c) * args.n) = make_uint2(codes[c][h], codes[4 + c][h]);
    }
  }
}

}  // namespace

void quantize_weights(const QuantizeWeightsArgs& args, cudaStream_t stream) {
  constexpr const char* kWhere = "quant::quantize_weights";
  CARACAL_CHECK(args.experts >= 0, kWhere, ": experts must be non-negative, got ", args.experts);
  CARACAL_CHECK(args.n > 0 && args.n % 8 == 0, kWhere, ": n must be a positive multiple of 8, got ", args.n);
  CARACAL_CHECK(args.k > 0 && args.k % 8 == 0, kWhere, ": k must be a positive multiple of 8, got ", args.k);
  if (args.experts == 0) return;
  check_operands(kWhere, {{args.weights, "weights", 16}});
  CARACAL_CHECK((args.codes == nullptr) == (args.scales == nullptr), kWhere,
                ": codes and scales must both be given or both be null");
  CARACAL_CHECK((args.codes_t == nullptr) == (args.scales_t == nullptr), kWhere,
                ": codes_t and scales_t must both be given or both be null");
  CARACAL_CHECK(args.codes != nullptr || args.codes_t != nullptr, kWhere,
                ": at least one of codes and codes_t must be given");
  CARACAL_CHECK(reinterpret_cast<uintptr_t>(args.codes) % 8 == 0, kWhere, ": codes must be 8-byte aligned");
  CARACAL_CHECK(reinterpret_cast<uintptr_t>(args.codes_t) % 8 == 0, kWhere, ": codes_t must be 8-byte aligned");
  const int64_t blocks = args.experts * weight_blocks(args.n) * weight_blocks(args.k);
  CARACAL_CHECK(blocks <= INT_MAX, kWhere, ": experts * blocks(n) * blocks(k) must be below 2^31, got ", blocks);
  quantize_weights_kernel<<<static_cast<int>(blocks), kThreads, 0, stream>>>(args);
  check_cuda(cudaGetLastError(), "quantize_weights_kernel launch");
}

}  // namespace caracal::quant
