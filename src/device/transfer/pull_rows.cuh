#pragma once
// The pull loop of dispatch and reverse combine (DESIGN §2): every warp of `warps` takes schedule
// rows of the local ranks in turn; the warp that meets a token's first row in the window loads the
// token's home row once and stores it into all of the token's rows there (token_group.cuh), the
// others skip theirs; padding rows are zeroed. Reverse combine also carries g beside each row.
// The home rows must be published before the launch's entry barrier (row_copy.cuh says why).
#include <cuda_bf16.h>

#include "caracal/comm/symmetric_ptr.hpp"
#include "caracal/precision_traits.hpp"
#include "device/comm/device_world.cuh"
#include "device/transfer/device_params.hpp"
#include "device/transfer/schedule_rows.cuh"
#include "device/transfer/token_group.cuh"
#include "device/transfer/warp_work.cuh"

namespace caracal::transfer {

// Where a pull reads and writes: home token rows [T][D] into expert rows [R][D], rows in the
// layer's precision (LayerRow: caracal/precision_traits.hpp); with gates, also g of each row's
// route (home gates [T*k]) into expert_gates [R], not applied to the row: the router-score
// gradient needs <dy, E(x)> before g (DESIGN §3). Padding rows get g = 0.
struct PullRows {
  comm::SymmetricPtr<LayerRow> home_rows;
  comm::SymmetricPtr<LayerRow> expert_rows;
  comm::SymmetricPtr<float> home_gates;    // with gates only
  comm::SymmetricPtr<float> expert_gates;  // with gates only
  int top_k;
  int hidden;
};

// The rows of `window` (expert_rows per buffer row, expert_gates per schedule row), but those it
// leaves in place (window.in_place): each token's home row read once for all its rows in the
// window (token_group.cuh), or once per row with `per_route` (the measurement of DESIGN §2's bytes).
// kWithGates: also carry g, each row its own route's. kCoherent: ld.global (the default, measured
// faster), else ld.global.nc.
template <bool kWithGates, bool kCoherent>
__device__ void pull_schedule_rows(const comm::DeviceWorld& world, const ScheduleParams& schedule,
                                   const PullWindow& window, WarpWorkers warps, const PullRows& pull, bool per_route) {
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  for_each_window_row(world, schedule, window, warps, [&](int rank, int row, int2 entry) {
    if (entry.x >= 0 && window.in_place != RowsInPlace::kNone) {
      const bool on_this_gpu =
          static_cast<unsigned>(entry.x - world.first_local_rank) < static_cast<unsigned>(world.local_ranks);
      if (window.in_place == RowsInPlace::kAll || !on_this_gpu) return;  // already there
    }
    LayerRow* const expert_rows = world.at(pull.expert_rows, rank);
    const auto buffer_row = [&](int r) {
      return row_vectors(expert_rows, window.ring_rows > 0 ? r % window.ring_rows : r, pull.hidden);
    };
    if (entry.x < 0) {  // padding
      if constexpr (kWithGates) {
        if (lane == 0) world.at(pull.expert_gates, rank)[row] = 0.0f;
      }
      warp_zero_row(buffer_row(row), pull.hidden / kBf16PerVector, lane);
      return;
    }
    const TokenGroup group(per_route ? nullptr : world.at(schedule.buffers.route_rows, rank), schedule.routes,
                           pull.top_k, entry, row, window.first_row, window.end_row);
    if (!group.led_by_own_row(lane)) return;  // pulled by the warp that meets the group's leader
    if constexpr (kWithGates) {
      pull_group_gates(group, world.at(pull.home_gates, entry.x), world.at(pull.expert_gates, rank), lane);
    }
    const uint4* home_row = row_vectors(world.at(pull.home_rows, entry.x), entry.y / pull.top_k, pull.hidden);
    warp_fan_out_row<kCoherent>(group, home_row, pull.hidden / kBf16PerVector, buffer_row, lane);
  });
}

}  // namespace caracal::transfer
