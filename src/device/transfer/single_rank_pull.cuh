#pragma once
// The pulls (dispatch, reverse combine) when the world has one rank: every token's home row is on
// this GPU, so the work is laid out by token rather than by schedule row. pull_rows.cuh hands out
// schedule rows, of which only a group's leader carries the copy (one row in k at W = 1): its warps
// drew uneven shares of leaders (ncu, DeepSeek-V3 W = 1 dispatch: the busiest SM 1.7x the mean).
// Here the tokens' rows are cut into chunks of 32 vectors (512 bytes) and every warp takes an equal
// run of consecutive chunks; for each token of its run it loads the chunks once and stores them
// into each of the token's rows in the window (the same bits as the row-major pull). Padding rows
// are zeroed by a pass over the window's rows. Needs no barrier: stream order publishes the home
// rows (one rank), so the launch may take every SM.
#include <cuda_bf16.h>

#include "device/comm/device_world.cuh"
#include "device/transfer/device_params.hpp"
#include "device/transfer/pull_rows.cuh"
#include "device/transfer/routing_fault.cuh"
#include "device/transfer/row_copy.cuh"
#include "device/transfer/schedule_rows.cuh"
#include "device/transfer/warp_work.cuh"

namespace caracal::transfer {

// The rows of `window` of the one rank's schedule, as pull_schedule_rows gives them (kWithGates:
// g too, per schedule row; kCoherent: ld.global, else ld.global.nc). Call from every thread of a
// launch of whole warps; tokens * ceil(hidden / 256) must fit in 32 bits.
template <bool kWithGates, bool kCoherent>
__device__ void pull_rows_single_rank(const comm::DeviceWorld& world, const ScheduleParams& schedule,
                                      const PullWindow& window, const PullRows& pull, int tokens) {
  const int rank = world.first_local_rank;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int vectors = pull.hidden / kBf16PerVector;
  __nv_bfloat16* const expert_rows = world.at(pull.expert_rows, rank);
  const auto buffer_row = [&](int r) {
    return row_vectors(expert_rows, window.ring_rows > 0 ? r % window.ring_rows : r, pull.hidden);
  };
  // In a world of one rank every token is on this GPU: RowsInPlace::kOtherGpus leaves no row in
  // place, kAll every real row.
  if (window.in_place != RowsInPlace::kAll) {
    const int2* locations = world.at(schedule.buffers.route_location, rank);
    const int32_t* ids = world.at(schedule.buffers.topk_idx, rank);
    for_each_token_run(tokens, vectors, [&](int token, int first_vector, int end_vector) {
      const int64_t first_route = static_cast<int64_t>(token) * pull.top_k;
      // The token's rows in the window: slot j's on lane j (32 slots a round).
      for (int base = 0; base < pull.top_k; base += kWarpSize) {
        const int slot = base + lane;
        int row = -1;
        if (slot < pull.top_k && is_routed(ids[first_route + slot], schedule.num_experts)) {
          const int r = locations[first_route + slot].y;
          if (r >= window.first_row && r < window.end_row) row = r;
        }
        const unsigned members = __ballot_sync(~0u, row >= 0);
        if (members == 0u) continue;
        if constexpr (kWithGates) {  // once per token: by the warp holding its first chunk
          if (row >= 0 && first_vector == 0) {
            world.at(pull.expert_gates, rank)[row] = world.at(pull.home_gates, rank)[first_route + slot];
          }
        }
        const uint4* src = row_vectors(world.at(pull.home_rows, rank), token, pull.hidden);
        warp_fan_out_vectors<kCoherent>(src, first_vector, end_vector, members, row, buffer_row, lane);
      }
    });
  }
  // The window's padding rows: zero, with g = 0.
  for_each_window_row(world, schedule, window, launch_warps(), [&](int, int row, int2 entry) {
    if (entry.x >= 0) return;
    if constexpr (kWithGates) {
      if (lane == 0) world.at(pull.expert_gates, rank)[row] = 0.0f;
    }
    warp_zero_row(buffer_row(row), vectors, lane);
  });
}

}  // namespace caracal::transfer
