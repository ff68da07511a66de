#pragma once
// A rank's schedule as the transfer loops read it: the same ScheduleView the grouped GEMMs take
// (caracal/schedule_view.hpp), made on the device for any local rank of a launch.
#include "caracal/schedule_view.hpp"
#include "device/comm/device_world.cuh"
#include "device/transfer/device_params.hpp"
#include "device/transfer/warp_work.cuh"

namespace caracal::transfer {

// Rank `rank`'s view (every schedule row has its own buffer row: ring_rows 0).
__device__ __forceinline__ ScheduleView rank_schedule(const comm::DeviceWorld& world, const ScheduleParams& p,
                                                      int rank) {
  return ScheduleView{world.at(p.buffers.expert_offset, rank), world.at(p.buffers.expert_count, rank),
                      p.local_experts, p.row_capacity, 0, world.at(p.buffers.rows, rank)};
}

// Calls visit(rank, row, entry) for the schedule rows [0, expert_offset[L]) of every local rank,
// `entry` being the row's {src_rank, src_route}; the schedule was built before this launch.
template <typename Visit>
__device__ void for_each_schedule_row(const comm::DeviceWorld& world, const ScheduleParams& p, WarpWorkers workers,
                                      Visit&& visit) {
  for_each_local_item(
      world, workers, [&](int rank) { return rank_schedule(world, p, rank).expert_offset[p.local_experts]; },
      [&](int rank, int row) { visit(rank, row, rank_schedule(world, p, rank).rows[row]); });
}

// Calls visit(rank, row, entry) for the schedule rows [window.first_row, window.end_row) below
// expert_offset[L] of every local rank, as for_each_schedule_row.
template <typename Visit>
__device__ void for_each_window_row(const comm::DeviceWorld& world, const ScheduleParams& p, const PullWindow& window,
                                    WarpWorkers workers, Visit&& visit) {
  for_each_local_item(
      world, workers,
      [&](int rank) {
        const int rows = min(rank_schedule(world, p, rank).expert_offset[p.local_experts], window.end_row);
        return max(rows - window.first_row, 0);
      },
      [&](int rank, int i) {
        const int row = window.first_row + i;
        visit(rank, row, rank_schedule(world, p, rank).rows[row]);
      });
}

}  // namespace caracal::transfer
