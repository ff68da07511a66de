#pragma once
// The FP8 pulls (TokenExchange::dispatch_fp8, reverse_combine_fp8): rows of x or dy in e4m3 with
// their 1 x 128 block scales, quantized at home, into the expert side's schedule rows (dy's with g
// of each row's route beside them, as the bf16 reverse combine carries it). The codes move as the bf16
// pulls move rows (pull_rows.cuh across ranks, a token's home row read once per (token, rank);
// single_rank_pull.cuh by token in a world of one rank), as 16-byte vectors of 16 codes; each row's
// scales are stored down the FP8 GEMMs' MN-major layout (block b of row r at b * scale_stride + r).
// A row gets its home token's codes and scales bit for bit; padding rows zero codes under
// zero_scale. The home rows must be published before the launch's entry barrier (row_copy.cuh).
#include <cuda_fp8.h>

#include <cstdint>

#include "caracal/comm/symmetric_ptr.hpp"
#include "device/comm/device_world.cuh"
#include "device/transfer/device_params.hpp"
#include "device/transfer/exchange_args.hpp"
#include "device/transfer/routing_fault.cuh"
#include "device/transfer/row_copy.cuh"
#include "device/transfer/schedule_rows.cuh"
#include "device/transfer/token_group.cuh"
#include "device/transfer/warp_work.cuh"

namespace caracal::transfer {

inline constexpr int kFp8PerVector = 16;     // e4m3 codes per 16-byte vector
inline constexpr int kFp8ScaleBlock = 128;   // codes per fp32 scale along a row

// Where an FP8 pull reads and writes (exchange_buffers.hpp's x_codes ... expert_x_scales, or dy's),
// and with gates g of each row's route (home gates [T*k] into expert_gates [rows]; padding rows 0).
struct PullFp8Rows {
  comm::SymmetricPtr<__nv_fp8_e4m3> home_codes;    // [home_rows][D]
  comm::SymmetricPtr<float> home_scales;           // [D / 128][home_rows]
  comm::SymmetricPtr<__nv_fp8_e4m3> expert_codes;  // [scale_stride][D]
  comm::SymmetricPtr<float> expert_scales;         // [D / 128][scale_stride]
  int top_k;
  int hidden;        // D, a multiple of 128
  int scale_stride;  // the expert rows' count (the schedule view's buffer rows)
  int home_rows;     // the home scales' stride
  float zero_scale;  // a padding row's scales: those the quantizer gives a zero block
  comm::SymmetricPtr<float> home_gates;    // with gates only
  comm::SymmetricPtr<float> expert_gates;  // with gates only
};

// The exchange's FP8 dispatch: x_codes and x_scales into expert_x_codes and expert_x_scales, the
// scales strided by the schedule's rows (no ring).
__host__ __device__ inline PullFp8Rows fp8_pull_rows(const detail::ExchangeArgs& args) {
  return {args.forward.x_codes,        args.forward.x_scales, args.forward.expert_x_codes,
          args.forward.expert_x_scales, args.top_k,            args.hidden,
          args.schedule.row_capacity,   args.fp8_home_rows,    args.fp8_zero_scale, {}, {}};
}

// The exchange's FP8 reverse combine: dy_codes and dy_scales into expert_dy_codes and
// expert_dy_scales, and g into expert_gates.
__host__ __device__ inline PullFp8Rows fp8_dy_pull_rows(const detail::ExchangeArgs& args) {
  return {args.backward.dy_codes,        args.backward.dy_scales, args.backward.expert_dy_codes,
          args.backward.expert_dy_scales, args.top_k,              args.hidden,
          args.schedule.row_capacity,     args.fp8_home_rows,      args.fp8_zero_scale,
          args.router.gates,              args.backward.expert_gates};
}

__device__ __forceinline__ uint4* fp8_row_vectors(__nv_fp8_e4m3* base, int64_t row, int hidden) {
  return reinterpret_cast<uint4*>(base + row * hidden);
}
__device__ __forceinline__ const uint4* fp8_row_vectors(const __nv_fp8_e4m3* base, int64_t row, int hidden) {
  return reinterpret_cast<const uint4*>(base + row * hidden);
}

// One warp stores a token's `blocks` scales (block b at src[b * src_stride]) into the row of each
// lane in `members` (lanes whose `mine` names a row), each scale loaded once. Call from all lanes.
__device__ __forceinline__ void warp_fan_out_scales(const float* src, int src_stride, int blocks, unsigned members,
                                                    int mine, float* scales, int stride, int lane) {
  for (int base = 0; base < blocks; base += kWarpSize) {
    const int b = base + lane;
    const float s = b < blocks ? load_coherent_f32(src + static_cast<int64_t>(b) * src_stride) : 0.0f;
    for (unsigned rest = members; rest != 0u; rest &= rest - 1u) {
      const int row = __shfl_sync(~0u, mine, __ffs(rest) - 1);
      if (b < blocks) scales[static_cast<int64_t>(b) * stride + row] = s;
    }
  }
}

// A padding row: zero codes, every scale zero_scale.
__device__ __forceinline__ void warp_zero_fp8_row(const PullFp8Rows& pull, __nv_fp8_e4m3* codes, float* scales,
                                                  int row, int lane) {
  warp_zero_row(fp8_row_vectors(codes, row, pull.hidden), pull.hidden / kFp8PerVector, lane);
  for (int b = lane; b < pull.hidden / kFp8ScaleBlock; b += kWarpSize) {
    scales[static_cast<int64_t>(b) * pull.scale_stride + row] = pull.zero_scale;
  }
}

// Across ranks: the rows of `window` (no ring) of every local rank, as pull_schedule_rows pulls bf16
// rows (per_route: a token's home row read once per route); kWithGates: g too.
template <bool kWithGates>
__device__ inline void pull_fp8_schedule_rows(const comm::DeviceWorld& world, const ScheduleParams& schedule,
                                       const PullWindow& window, WarpWorkers warps, const PullFp8Rows& pull,
                                       bool per_route) {
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int blocks = pull.hidden / kFp8ScaleBlock;
  for_each_window_row(world, schedule, window, warps, [&](int rank, int row, int2 entry) {
    __nv_fp8_e4m3* const codes = world.at(pull.expert_codes, rank);
    float* const scales = world.at(pull.expert_scales, rank);
    if (entry.x < 0) {
      if constexpr (kWithGates) {
        if (lane == 0) world.at(pull.expert_gates, rank)[row] = 0.0f;
      }
      warp_zero_fp8_row(pull, codes, scales, row, lane);
      return;
    }
    const TokenGroup group(per_route ? nullptr : world.at(schedule.buffers.route_rows, rank), schedule.routes,
                           pull.top_k, entry, row, window.first_row, window.end_row);
    if (!group.led_by_own_row(lane)) return;  // pulled by the warp that meets the group's leader
    if constexpr (kWithGates) {
      pull_group_gates(group, world.at(pull.home_gates, entry.x), world.at(pull.expert_gates, rank), lane);
    }
    const int64_t token = entry.y / pull.top_k;
    const uint4* const src = fp8_row_vectors(world.at(pull.home_codes, entry.x), token, pull.hidden);
    warp_fan_out_row<kCoherentPulls>(
        group, src, pull.hidden / kFp8PerVector, [&](int r) { return fp8_row_vectors(codes, r, pull.hidden); }, lane);
    const float* const token_scales = world.at(pull.home_scales, entry.x) + token;
    for_each_slot_round(group, lane, [&](int, int mine) {
      const unsigned members = __ballot_sync(~0u, mine >= 0);
      if (members != 0u) {
        warp_fan_out_scales(token_scales, pull.home_rows, blocks, members, mine, scales, pull.scale_stride, lane);
      }
    });
  });
}

// In a world of one rank, each schedule row's scales (and g) by the row: lane l of a warp takes row
// base + l, so a block's scales go out as one coalesced store of 32 rows (the home scales, a few
// MB at most, are read from L2); padding rows get zero_scale (and g = 0).
template <bool kWithGates>
__device__ inline void store_fp8_row_scales_single_rank(const comm::DeviceWorld& world, const ScheduleParams& schedule,
                                                        const PullFp8Rows& pull) {
  const int rank = world.first_local_rank;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int blocks = pull.hidden / kFp8ScaleBlock;
  const ScheduleView view = rank_schedule(world, schedule, rank);
  const int rows = view.expert_offset[schedule.local_experts];
  const float* const home_scales = world.at(pull.home_scales, rank);
  float* const scales = world.at(pull.expert_scales, rank);
  const WarpWorkers warps = launch_warps();
  for (int base = warps.index * kWarpSize; base < rows; base += warps.count * kWarpSize) {
    const int row = base + lane;
    if (row >= rows) break;
    const int2 entry = view.rows[row];
    const int token = entry.x >= 0 ? entry.y / pull.top_k : -1;
    if constexpr (kWithGates) {
      world.at(pull.expert_gates, rank)[row] = token >= 0 ? world.at(pull.home_gates, rank)[entry.y] : 0.0f;
    }
    for (int b = 0; b < blocks; ++b) {
      scales[static_cast<int64_t>(b) * pull.scale_stride + row] =
          token >= 0 ? home_scales[static_cast<int64_t>(b) * pull.home_rows + token] : pull.zero_scale;
    }
  }
}

// In a world of one rank: the rows' codes of the whole schedule by token, as pull_rows_single_rank
// pulls bf16 rows (equal runs of 512-byte chunks a warp), then the padding rows' zero codes; the
// scales (and g) by the row (store_fp8_row_scales_single_rank). Call from every thread of a launch
// of whole warps.
template <bool kWithGates>
__device__ inline void pull_fp8_rows_single_rank(const comm::DeviceWorld& world, const ScheduleParams& schedule,
                                          const PullFp8Rows& pull, int tokens) {
  const int rank = world.first_local_rank;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int vectors = pull.hidden / kFp8PerVector;
  __nv_fp8_e4m3* const codes = world.at(pull.expert_codes, rank);
  const int2* const locations = world.at(schedule.buffers.route_location, rank);
  const int32_t* const ids = world.at(schedule.buffers.topk_idx, rank);
  for_each_token_run(tokens, vectors, [&](int token, int first_vector, int end_vector) {
    const int64_t first_route = static_cast<int64_t>(token) * pull.top_k;
    for (int base = 0; base < pull.top_k; base += kWarpSize) {  // slot j's row on lane j, 32 a round
      const int slot = base + lane;
      const int row = slot < pull.top_k && is_routed(ids[first_route + slot], schedule.num_experts)
                          ? locations[first_route + slot].y
                          : -1;
      const unsigned members = __ballot_sync(~0u, row >= 0);
      if (members == 0u) continue;
      const uint4* const src = fp8_row_vectors(world.at(pull.home_codes, rank), token, pull.hidden);
      warp_fan_out_vectors<kCoherentPulls>(src, first_vector, end_vector, members, row,
                                           [&](int r) { return fp8_row_vectors(codes, r, pull.hidden); }, lane);
    }
  });
  for_each_schedule_row(world, schedule, launch_warps(), [&](int, int row, int2 entry) {
    if (entry.x < 0) warp_zero_row(fp8_row_vectors(codes, row, pull.hidden), vectors, lane);
  });
  store_fp8_row_scales_single_rank<kWithGates>(world, schedule, pull);
}

}  // namespace caracal::transfer
