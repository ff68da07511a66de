#pragma once
// The pull loop of dispatch and reverse combine (DESIGN §2): every warp of `warps` takes schedule
// rows of the local ranks in turn and loads each row's home token row into its expert-side buffer
// row (one warp a row; padding rows are zeroed). Reverse combine also carries g beside the row.
// The home rows must be published before the launch's entry barrier (row_copy.cuh says why).
#include <cuda_bf16.h>

#include "caracal/comm/symmetric_ptr.hpp"
#include "device/comm/device_world.cuh"
#include "device/transfer/device_params.hpp"
#include "device/transfer/schedule_rows.cuh"
#include "device/transfer/token_rows.cuh"
#include "device/transfer/warp_work.cuh"

namespace caracal::transfer {

// Where a pull reads and writes: home token rows [T][D] into expert rows [R][D]; with gates, also
// g of each row's route (home gates [T*k]) into expert_gates [R], not applied to the row: the
// router-score gradient needs <dy, E(x)> before g (DESIGN §3). Padding rows get g = 0.
struct PullRows {
  comm::SymmetricPtr<__nv_bfloat16> home_rows;
  comm::SymmetricPtr<__nv_bfloat16> expert_rows;
  comm::SymmetricPtr<float> home_gates;    // with gates only
  comm::SymmetricPtr<float> expert_gates;  // with gates only
  int top_k;
  int hidden;
};

// The rows of `window` (expert_rows per buffer row, expert_gates per schedule row), but those it
// leaves in place (window.in_place). kWithGates: also carry g. kCoherent: ld.global (the default,
// measured faster), else ld.global.nc.
template <bool kWithGates, bool kCoherent>
__device__ void pull_schedule_rows(const comm::DeviceWorld& world, const ScheduleParams& schedule,
                                   const PullWindow& window, WarpWorkers warps, const PullRows& pull) {
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  for_each_window_row(world, schedule, window, warps, [&](int rank, int row, int2 entry) {
    if (entry.x >= 0 && window.in_place != RowsInPlace::kNone) {
      const bool on_this_gpu =
          static_cast<unsigned>(entry.x - world.first_local_rank) < static_cast<unsigned>(world.local_ranks);
      if (window.in_place == RowsInPlace::kAll || !on_this_gpu) return;  // already there
    }
    if constexpr (kWithGates) {
      if (lane == 0) {
        world.at(pull.expert_gates, rank)[row] = entry.x < 0 ? 0.0f : world.at(pull.home_gates, entry.x)[entry.y];
      }
    }
    pull_token_row<kCoherent>(world, entry, pull.home_rows, pull.top_k, pull.hidden,
                              row_vectors(world.at(pull.expert_rows, rank),
                                          window.ring_rows > 0 ? row % window.ring_rows : row, pull.hidden),
                              lane);
  });
}

}  // namespace caracal::transfer
