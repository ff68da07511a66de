// quantize_weights (quantize_fp8.hpp): one CTA a 128 x 128 block of one expert's [n][k] weights.
#include <climits>

#include "caracal/comm/cuda_check.hpp"
#include "caracal/error.hpp"
#include "quant/block_tile.cuh"
#include "quant/operand_checks.hpp"
#include "quant/quantize_fp8.hpp"

namespace caracal::quant {
namespace {

__global__ void __launch_bounds__(kTileThreads) quantize_weights_kernel(const QuantizeWeightsArgs args) {
  __shared__ float warp_amax[kTileThreads / 32];
  __shared__ TransposeTile transposed;
  const int64_t n_blocks = weight_blocks(args.n), k_blocks = weight_blocks(args.k);
  const int64_t flat = blockIdx.x;
  const int64_t expert = flat / (n_blocks * k_blocks);
  const int64_t nb = flat / k_blocks % n_blocks, kb = flat % k_blocks;
  const int thread = static_cast<int>(threadIdx.x);
  BlockTile tile;
  tile.rows_here = static_cast<int>(min(int64_t(kTileSide), args.n - nb * kTileSide));
  tile.cols_here = static_cast<int>(min(int64_t(kTileSide), args.k - kb * kTileSide));
  tile.load(args.weights + (expert * args.n + nb * kTileSide) * args.k + kb * kTileSide, args.k);

  const float thread_amax = warp_max(tile.thread_amax());
  if (thread % 32 == 0) warp_amax[thread / 32] = thread_amax;
  __syncthreads();
  float amax = 0.0f;
  for (float a : warp_amax) amax = fmaxf(amax, a);
  const BlockScale s = device_block_scale(amax, args.rounding);
  float inverse[8];
  for (float& x : inverse) x = s.inverse;

  const int64_t first_code = (expert * args.n + nb * kTileSide) * args.k + kb * kTileSide;
  for (int i = 0; i < kTileRowsPerThread; ++i) {
    const uint2 packed = tile.codes(i, inverse);
    transposed.put(BlockTile::row(i), BlockTile::col(), packed);
    if (args.codes != nullptr && BlockTile::row(i) < tile.rows_here && BlockTile::col() < tile.cols_here) {
      *reinterpret_cast<uint2*>(args.codes + first_code + BlockTile::row(i) * args.k + BlockTile::col()) = packed;
    }
  }
  if (thread == 0) {
    if (args.scales != nullptr) args.scales[(expert * k_blocks + kb) * weight_scale_row(n_blocks) + weight_scale_at(nb)] = s.scale;
    if (args.scales_t != nullptr) args.scales_t[(expert * n_blocks + nb) * weight_scale_row(k_blocks) + weight_scale_at(kb)] = s.scale;
  }
  if (args.codes_t == nullptr) return;
  __syncthreads();
  transposed.store_transposed(reinterpret_cast<uint8_t*>(args.codes_t) + (expert * args.k + kb * kTileSide) * args.n +
                                  nb * kTileSide,
                              args.n, tile.rows_here, tile.cols_here);
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
  CARACAL_CHECK(reinterpret_cast<uintptr_t>(args.codes_t) % 4 == 0, kWhere, ": codes_t must be 4-byte aligned");
  const int64_t blocks = args.experts * weight_blocks(args.n) * weight_blocks(args.k);
  CARACAL_CHECK(blocks <= INT_MAX, kWhere, ": experts * blocks(n) * blocks(k) must be below 2^31, got ", blocks);
  quantize_weights_kernel<<<static_cast<int>(blocks), kTileThreads, 0, stream>>>(args);
  check_cuda(cudaGetLastError(), "quantize_weights_kernel launch");
}

}  // namespace caracal::quant
