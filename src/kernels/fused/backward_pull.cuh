#pragma once
// The fused backward's communication role: first the window's g (each route's, from its home
// rank, into expert_gates: the dgrad epilogue reads it), raising gates_ready once per comm CTA; then
// the window's dy rows of the rank's schedule from their home ranks into expert_dy's ring rows
// (the weight gradients after the launch read them there), counting into each 128-row block's
// dy_ready the rows the dgrad tiles read from the ring (those of tokens on other GPUs; every one
// with pull_all_rows) as they land; they gather the others where they are. Then, where asked, the
// window's x rows into expert_x for the weight gradients (no counter: the stream orders them). The
// same rows and bits as TokenExchange::reverse_combine and dispatch over the window: a token is
// read once per window for all its rows there (token_group.cuh), padding rows are zeroed (g = 0).
//
// Every warp of the rank's comm CTAs takes the window's rows in turn, so the blocks fill in order;
// the warp that meets a token's first row stores all of its rows, then raises the counter of each
// block they fell in by the rows it stored there.
#include <cstdint>

#include "device/comm/cta_place.cuh"
#include "device/comm/device_world.cuh"
#include "device/comm/ready_flags.cuh"
#include "device/gemm/gemm_config.cuh"
#include "device/transfer/pull_rows.cuh"
#include "device/transfer/schedule_rows.cuh"
#include "device/transfer/token_group.cuh"
#include "device/transfer/warp_work.cuh"
#include "kernels/fused/backward_params.cuh"

namespace caracal::fused {

// Whether the dgrad tiles read schedule row `entry`'s dy from the ring (a token of another GPU, or
// every token with pull_all_rows), rather than from its home rows.
__device__ inline bool dy_read_from_ring(const comm::DeviceWorld& world, int2 entry, bool pull_all_rows) {
  return pull_all_rows ||
         static_cast<unsigned>(entry.x - world.first_local_rank) >= static_cast<unsigned>(world.local_ranks);
}

// All threads of a comm CTA of rank place.rank: its window's g, then its dy rows.
__device__ inline void pull_window_dy(const comm::DeviceWorld& world, const comm::CtaPlace& place,
                                      const BackwardKernelParams& p, const FusedBackwardRankParams& rank) {
  const int lane = static_cast<int>(threadIdx.x) % transfer::kWarpSize;
  const transfer::WarpWorkers warps = transfer::rank_warps(place);
  const ScheduleView& view = rank.tiles.dgrad.schedule;  // its window and ring
  const transfer::PullRows& pull = p.dy_pull;
  const int end_row = min(view.end_row, view.expert_offset[view.num_experts]);
  float* expert_gates = world.at(pull.expert_gates, place.rank);
  // g of every row, a lane a row; then the CTA's count (after all its threads' stores).
  for (int row = view.first_row + warps.index * transfer::kWarpSize + lane; row < end_row;
       row += warps.count * transfer::kWarpSize) {
    const int2 entry = view.rows[row];
    expert_gates[row] = entry.x < 0 ? 0.0f : world.at(pull.home_gates, entry.x)[entry.y];
  }
  comm::signal_ready(rank.gates_ready);

  __nv_bfloat16* expert_rows = world.at(pull.expert_rows, place.rank);
  const int32_t* route_rows = p.rows_per_route ? nullptr : world.at(p.schedule.buffers.route_rows, place.rank);
  const auto ring_row = [&](int row) { return transfer::row_vectors(expert_rows, view.buffer_row(row), pull.hidden); };
  const int vectors = pull.hidden / transfer::kBf16PerVector;
  for (int row = view.first_row + warps.index; row < end_row; row += warps.count) {
    const int2 entry = view.rows[row];
    if (entry.x < 0) {  // padding: zeros (the dgrad tiles zero-fill it themselves)
      transfer::warp_zero_row(ring_row(row), vectors, lane);
      continue;
    }
    const transfer::TokenGroup group(route_rows, p.schedule.routes, pull.top_k, entry, row, view.first_row, end_row);
    if (!group.led_by_own_row(lane)) continue;  // pulled by the warp that meets the group's leader
    transfer::warp_fan_out_row<true>(
        group, transfer::row_vectors(world.at(pull.home_rows, entry.x), entry.y / pull.top_k, pull.hidden), vectors,
        ring_row, lane);
    if (!dy_read_from_ring(world, entry, p.pull_all_rows)) continue;
    // Count the rows into their blocks, one release per block: every lane's stores before it.
    __syncwarp();
    transfer::for_each_slot_round(group, lane, [&](int, int member) {
      const int block = member >= 0 ? view.buffer_row(member) / gemm::kBlockM : -1;
      const unsigned same_block = __match_any_sync(0xffffffffu, block);
      if (block >= 0 && lane == __ffs(same_block) - 1) {
        comm::signal_ready_thread(rank.dy_ready + block, static_cast<uint32_t>(__popc(same_block)));
      }
    });
  }
}

// All threads of a comm CTA. Returns false when the entry barrier failed (timeout or aborted
// world, recorded): the CTA computes on, and its waits fail as fast.
__device__ inline bool pull_backward_rows(const comm::DeviceWorld& world, const comm::CtaPlace& place,
                                          const BackwardKernelParams& p) {
  // Every rank's dy (and, before the pass, its x and gates) published; no peer still reads in an
  // earlier launch what the pulls overwrite.
  if (p.barrier && !comm::world_barrier(world, place)) return false;
  pull_window_dy(world, place, p, p.ranks[place.local_rank]);
  if (p.pull_x) {
    // The comm warps of every local rank share all local ranks' x rows.
    transfer::pull_schedule_rows<false, true>(world, p.schedule, p.x_window, transfer::role_warps(world, place),
                                              p.x_pull, p.rows_per_route);
  }
  return true;
}

}  // namespace caracal::fused
