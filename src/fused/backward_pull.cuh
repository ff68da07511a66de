#pragma once
// The fused backward's communication role (a launch that moves rows: Gemms::kRowsInLaunch; else it
// only counts the rows there): pull the window's dy rows (and each route's g) that the
// reverse combine launched before it left to it — those of tokens on other GPUs, or every real row
// with pull_all_rows — from their home ranks into expert_dy's ring rows, and count every row of
// each 128-row block into dy_ready as it is there (kBlockM: the block's dgrad tiles may load it by
// TMA): the pulled ones once stored, the others (copied, padding zeroed, by that launch: the stream
// orders it) at once. Then, where asked, the window's x rows into expert_x for the weight gradients
// after the launch (no counter: the stream orders them; with local_rows_in_launch the idle warps
// of the other CTAs copy them, backward_local_rows.cuh). The same rows and bits as
// TokenExchange::reverse_combine and dispatch over the window: a token is read once per window for
// all its rows there (token_group.cuh).
//
// The warps of the rank's comm CTAs first count the rows already there (a lane a row), then take
// the rows to pull in turn (for_each_wanted_item: a lane tests a row), so the blocks fill in order:
// the warp that meets a token's first row stores all of the group's rows and raises the counter of
// each block they fell in by the rows it stored there.
#include <cstdint>

#include "device/comm/cta_place.cuh"
#include "device/comm/device_world.cuh"
#include "device/comm/ready_flags.cuh"
#include "device/gemm/gemm_config.cuh"
#include "device/transfer/pull_rows.cuh"
#include "device/transfer/schedule_rows.cuh"
#include "device/transfer/token_group.cuh"
#include "device/transfer/warp_work.cuh"
#include "fused/backward_params.cuh"

namespace caracal::fused {

// Who puts schedule row `entry`'s dy into the ring: the reverse combine before the launch (it also
// zeroed the padding), the comm role's pull (tokens of other GPUs; every real row with
// pull_all_rows), or the idle warps' copy (tokens on this GPU with local_rows_in_launch). A launch
// that moves no rows (Gemms::kRowsInLaunch false) finds them all there.
enum class DyRowSource { kBeforeLaunch, kPull, kIdleWarps };

template <class Gemms>
__device__ inline DyRowSource dy_row_source(const comm::DeviceWorld& world, int2 entry,
                                            const BackwardKernelParams<Gemms>& p) {
  if (!Gemms::kRowsInLaunch || entry.x < 0) return DyRowSource::kBeforeLaunch;
  const bool on_this_gpu =
      static_cast<unsigned>(entry.x - world.first_local_rank) < static_cast<unsigned>(world.local_ranks);
  if (!on_this_gpu || p.pull_all_rows) return DyRowSource::kPull;
  return p.local_rows_in_launch ? DyRowSource::kIdleWarps : DyRowSource::kBeforeLaunch;
}

// Raises block counters by the lanes' rows (`row` < 0: none), one release per block: after every
// lane's stores.
__device__ inline void count_rows_into_blocks(uint32_t* counters, const ScheduleView& view, int row) {
  const int block = row >= 0 ? view.buffer_row(row) / gemm::kBlockM : -1;
  const unsigned same_block = __match_any_sync(0xffffffffu, block);
  if (block >= 0 && static_cast<int>(threadIdx.x % transfer::kWarpSize) == __ffs(same_block) - 1) {
    comm::signal_ready_thread(counters + block, static_cast<uint32_t>(__popc(same_block)));
  }
}

// The warps of a comm CTA of rank `rank`: the rows of its window that are there already, each
// counted into its block (a lane a row).
template <class Gemms>
__device__ inline void count_rows_there(const comm::DeviceWorld& world, const BackwardKernelParams<Gemms>& p,
                                        const FusedBackwardRankParams<Gemms>& rank, const ScheduleView& view,
                                        const transfer::WarpWorkers& warps, int end_row, int lane) {
  for (int first = view.first_row + warps.index * transfer::kWarpSize; first < end_row;
       first += warps.count * transfer::kWarpSize) {
    const int row = first + lane;
    const bool there = row < end_row && dy_row_source(world, view.rows[row], p) == DyRowSource::kBeforeLaunch;
    count_rows_into_blocks(rank.dy_ready, view, there ? row : -1);
  }
}

// All threads of a comm CTA of rank place.rank: its window's dy rows.
template <class Gemms>
__device__ inline void pull_window_dy(const comm::DeviceWorld& world, const comm::CtaPlace& place,
                                      const BackwardKernelParams<Gemms>& p, const FusedBackwardRankParams<Gemms>& rank) {
  const int lane = static_cast<int>(threadIdx.x) % transfer::kWarpSize;
  const transfer::WarpWorkers warps = transfer::rank_warps(place);
  const ScheduleView& view = rank.tiles.dgrad.schedule;  // its window and ring
  if constexpr (!Gemms::kRowsInLaunch) {
    count_rows_there(world, p, rank, view, warps, min(view.end_row, view.expert_offset[view.num_experts]), lane);
  } else {
    const transfer::PullRows& pull = p.dy_pull;
    const int end_row = min(view.end_row, view.expert_offset[view.num_experts]);
    __nv_bfloat16* expert_rows = world.at(pull.expert_rows, place.rank);
    float* expert_gates = world.at(pull.expert_gates, place.rank);
    const int32_t* route_rows = p.rows_per_route ? nullptr : world.at(p.schedule.buffers.route_rows, place.rank);
    const auto ring_row = [&](int row) { return transfer::row_vectors(expert_rows, view.buffer_row(row), pull.hidden); };
    const int vectors = pull.hidden / transfer::kBf16PerVector;
    // The rows already there first (at W = 1 that is every row but those the idle warps copy, and no
    // pull follows).
    count_rows_there(world, p, rank, view, warps, end_row, lane);
    // Then the others, a warp a token group.
    const auto to_pull = [&](int row) { return dy_row_source(world, view.rows[row], p) == DyRowSource::kPull; };
    transfer::for_each_wanted_item(view.first_row, end_row, warps, to_pull, [&](int row) {
      const int2 entry = view.rows[row];
      const transfer::TokenGroup group(route_rows, p.schedule.routes, pull.top_k, entry, row, view.first_row, end_row);
      if (!group.led_by_own_row(lane)) return true;  // pulled by the warp that meets the group's leader
      transfer::pull_group_gates(group, world.at(pull.home_gates, entry.x), expert_gates, lane);
      transfer::warp_fan_out_row<true>(
          group, transfer::row_vectors(world.at(pull.home_rows, entry.x), entry.y / pull.top_k, pull.hidden), vectors,
          ring_row, lane);
      __syncwarp();  // every lane's stores before the counts
      transfer::for_each_slot_round(group, lane,
                                    [&](int, int member) { count_rows_into_blocks(rank.dy_ready, view, member); });
      return true;
    });
  }
}

// All threads of a comm CTA. No world barrier: the reverse combine before the launch had the
// pass's, if any (fused_backward.hpp).
template <class Gemms>
__device__ inline void pull_backward_rows(const comm::DeviceWorld& world, const comm::CtaPlace& place,
                                          const BackwardKernelParams<Gemms>& p) {
  pull_window_dy(world, place, p, p.ranks[place.local_rank]);
  if constexpr (Gemms::kRowsInLaunch) {
    if (p.pull_x && !p.local_rows_in_launch) {
      // The comm warps of every local rank share all local ranks' x rows.
      transfer::pull_schedule_rows<false, true>(world, p.schedule, p.x_window, transfer::role_warps(world, place),
                                                p.x_pull, p.rows_per_route);
    }
  }
}

}  // namespace caracal::fused
