#pragma once
// The fused backward's dx push per (token, rank) (DESIGN §2): the dx tiles leave the rows of tokens
// on other ranks in this rank's ring of expert_dx rows (HomeSlotsEpilogue) and raise their block's
// dx_done; the three warps of each compute CTA that the producer thread leaves idle (warpgroup 0's
// warps 1-3) sum the window's groups — a token's routes on this rank in the window, led by the
// highest row, so that a group waits for no block after its leader's — in slot order in fp32, round
// once to bf16 and store one row into the home slot of the leader's route: one row per (token,
// rank, window) over the links instead of one per route, under the remaining tiles. They take
// kDxSumRowsPerItem rows at a time from the rank's sums counter, in row order (the order in which
// the dx tiles finish, roughly). The rows of the rank's own tokens went home from the epilogue
// (nothing to save); the home sums its own route slots and the other ranks' leader slots
// (TokenExchange::reverse_dispatch_filled_dx_slots with DxSlots::kPerTokenRank).
//
// Why not the consumer warpgroups: dx_sums tasks between the tiles keep the tensor cores idle while
// the warps wait on their loads, whether a task per block (the groups, led by their highest rows,
// crowd the last blocks) or in slices of rows.
#include <cuda_bf16.h>

#include "device/comm/cta_place.cuh"
#include "device/comm/device_world.cuh"
#include "device/comm/ready_flags.cuh"
#include "device/gemm/gemm_config.cuh"
#include "device/gemm/row_tile_scheduler.cuh"
#include "device/transfer/group_sum.cuh"
#include "fused/backward_params.cuh"

namespace caracal::fused {

// Rows a sums warp takes at a time.
inline constexpr int kDxSumRowsPerItem = 8;

// The count of a block's dx_done once its dx tiles' rows are stored: both consumer warpgroups of
// each of its tiles raise it once.
template <class Gemms>
__device__ inline uint32_t dx_rows_stored(const FusedBackwardRankParams<Gemms>& p) {
  return static_cast<uint32_t>(2 * p.tiles.dx.n_blocks);
}

// One warp: the group led by schedule row `row`, if it leads one of a token of another rank.
// Returns false when a wait failed (timeout or aborted world, recorded).
template <class Gemms>
__device__ inline bool sum_dx_group(const comm::DeviceWorld& world, const comm::CtaPlace& place,
                                    const FusedBackwardRankParams<Gemms>& p, const transfer::ScheduleParams& schedule,
                                    const int32_t* route_rows, int row, int window_end, int lane) {
  const ScheduleView& view = p.tiles.dx.schedule;
  const gemm::HomeSlotsEpilogue::Params& dx = p.dx_epilogue;
  const int2 entry = view.rows[row];
  if (entry.x < 0 || entry.x == dx.rank) return true;  // padding, or stored home by the epilogue
  const transfer::TokenGroup group(route_rows, schedule.routes, schedule.top_k, entry, row, view.first_row,
                                   window_end);
  if (!group.last_is_own_row(lane)) return true;
  bool ready = true;
  transfer::for_each_member(group, lane, [&](int, int member) {
    const int block = view.buffer_row(member) / gemm::kBlockM;
    if (ready) ready = comm::wait_ready_thread(world, place, p.dx_done + block, dx_rows_stored(p), block);
  });
  if (!__all_sync(~0u, ready)) return false;
  __syncwarp();  // every lane's loads after the lanes' acquires
  transfer::warp_store_group_sum<true, 2>(
      group, transfer::UnitGates{},
      [&](int member) { return transfer::row_vectors(dx.group_rows, view.buffer_row(member), dx.hidden); },
      transfer::row_vectors(world.at(dx.slots, entry.x), entry.y, dx.hidden), dx.hidden / transfer::kBf16PerVector,
      lane);
  return true;
}

// A sums warp of a compute CTA: items from the rank's sums counter until the window's rows run out
// or a wait fails.
template <class Gemms>
__device__ inline void sum_dx_groups(const comm::DeviceWorld& world, const comm::CtaPlace& place,
                                     const FusedBackwardRankParams<Gemms>& p, const transfer::ScheduleParams& schedule,
                                     int lane) {
  const int blocks = gemm::RowTileScheduler(p.tiles.dx, 0, 1).num_tiles() / p.tiles.dx.n_blocks;
  const int first_row = p.tiles.dx.schedule.first_row;
  const int window_end = first_row + blocks * gemm::kBlockM;
  const int items = blocks * (gemm::kBlockM / kDxSumRowsPerItem);
  const int32_t* route_rows = world.at(schedule.buffers.route_rows, place.rank);
  for (;;) {
    int item = 0;
    if (lane == 0) item = static_cast<int>(atomicAdd(p.sums_counter, 1u));
    item = __shfl_sync(~0u, item, 0);
    if (item >= items) return;
    const int row = first_row + item * kDxSumRowsPerItem;
    for (int r = row; r < row + kDxSumRowsPerItem; ++r) {
      if (!sum_dx_group(world, place, p, schedule, route_rows, r, window_end, lane)) return;
    }
  }
}

}  // namespace caracal::fused
