#pragma once
// The fused forward's communication role: pull the rank's schedule rows whose tokens live on other
// GPUs (x of each such route's token, from its home rank) into expert_x's ring rows, macrobatch by
// macrobatch in the tasks' order (forward_tasks.cuh), and count each 128-row block's pulled rows as
// they land. A block's pulls into the ring wait until the block that held those ring rows has been
// read by its up/gate tiles. Rows of tokens on this GPU (all of them in a loopback world, the
// rank's own at W = 1) and padding rows are not copied: the GEMM producer gathers them where they
// are (forward_compute.cuh); with pull_all_rows (tests) every row but padding is pulled.
//
// In FP8 a row is its e4m3 codes and its 1 x 128 scales (pull_fp8_rows.cuh's layout: block b of the
// ring's buffer row r at b * scale_stride + r), as TokenExchange::dispatch_fp8 pulls them.
//
// Every warp of the rank's comm CTAs copies rows, the rows dealt to the warps in turn (a lane tests
// a row: for_each_wanted_item; at W = 1 none is pulled), so the blocks fill in order. A token is
// read once per macrobatch for all its rows there (token_group.cuh, as v1's dispatch), by the warp
// that meets its first row; that warp then raises the counter of each block the token's rows fell
// in, by the rows it stored there. Warp copies, not bulk asynchronous copies through shared memory
// from one thread: those hold a stage per row until its store completes, and move fewer rows a CTA.
#include <cstdint>

#include "device/comm/cta_place.cuh"
#include "device/comm/device_world.cuh"
#include "device/comm/ready_flags.cuh"
#include "device/gemm/gemm_config.cuh"
#include "device/transfer/pull_fp8_rows.cuh"
#include "device/transfer/pull_rows.cuh"
#include "device/transfer/token_group.cuh"
#include "device/transfer/schedule_rows.cuh"
#include "device/transfer/warp_work.cuh"
#include "fused/forward_params.cuh"

namespace caracal::fused {

// The copy of a token's home row into the ring rows of its group's members on `rank` (their buffer
// rows in `view`): `copy(group, home, token, lane)` by one warp, all lanes. Made once per CTA.
__device__ inline auto ring_row_copy(const comm::DeviceWorld& world, const transfer::PullRows& pull, int rank,
                                     const ScheduleView& view) {
  __nv_bfloat16* expert_rows = world.at(pull.expert_rows, rank);
  return [&world, &pull, &view, expert_rows](const transfer::TokenGroup& group, int home, int64_t token, int lane) {
    transfer::warp_fan_out_row<true>(
        group, transfer::row_vectors(world.at(pull.home_rows, home), token, pull.hidden),
        pull.hidden / transfer::kBf16PerVector,
        [&](int row) { return transfer::row_vectors(expert_rows, view.buffer_row(row), pull.hidden); }, lane);
  };
}
__device__ inline auto ring_row_copy(const comm::DeviceWorld& world, const transfer::PullFp8Rows& pull, int rank,
                                     const ScheduleView& view) {
  __nv_fp8_e4m3* codes = world.at(pull.expert_codes, rank);
  float* scales = world.at(pull.expert_scales, rank);
  return [&world, &pull, &view, codes, scales](const transfer::TokenGroup& group, int home, int64_t token, int lane) {
    transfer::warp_fan_out_row<transfer::kCoherentPulls>(
        group, transfer::fp8_row_vectors(world.at(pull.home_codes, home), token, pull.hidden),
        pull.hidden / transfer::kFp8PerVector,
        [&](int row) { return transfer::fp8_row_vectors(codes, view.buffer_row(row), pull.hidden); }, lane);
    const float* token_scales = world.at(pull.home_scales, home) + token;
    transfer::for_each_slot_round(group, lane, [&](int, int mine) {
      const unsigned members = __ballot_sync(~0u, mine >= 0);
      if (members != 0u) {
        transfer::warp_fan_out_scales(token_scales, pull.home_rows, pull.hidden / transfer::kFp8ScaleBlock, members,
                                      mine >= 0 ? view.buffer_row(mine) : -1, scales, pull.scale_stride, lane);
      }
    });
  };
}

// One warp writes ring row `row` (a padding row) as dispatch writes one: zeros (in FP8, zero codes
// under the zero block's scale).
__device__ inline void zero_ring_row(const comm::DeviceWorld& world, const transfer::PullRows& pull, int rank,
                                     const ScheduleView& view, int row, int lane) {
  transfer::warp_zero_row(transfer::row_vectors(world.at(pull.expert_rows, rank), view.buffer_row(row), pull.hidden),
                          pull.hidden / transfer::kBf16PerVector, lane);
}
__device__ inline void zero_ring_row(const comm::DeviceWorld& world, const transfer::PullFp8Rows& pull, int rank,
                                     const ScheduleView& view, int row, int lane) {
  transfer::warp_zero_fp8_row(pull, world.at(pull.expert_codes, rank), world.at(pull.expert_scales, rank),
                              view.buffer_row(row), lane);
}

// All threads of a comm CTA. With `zero_padding_rows` the ring's padding rows are written too (a
// later launch reads every ring row). Returns false when a wait failed (timeout or aborted world,
// recorded).
template <class Gemms>
__device__ inline bool pull_forward_rows(const comm::DeviceWorld& world, const comm::CtaPlace& place,
                                         const transfer::ScheduleParams& schedule, const typename Gemms::Pull& pull,
                                         const FusedForwardRankParams<Gemms>& rank, bool pull_all_rows,
                                         bool per_route, bool zero_padding_rows) {
  const int lane = static_cast<int>(threadIdx.x) % transfer::kWarpSize;
  const transfer::WarpWorkers warps = transfer::rank_warps(place);
  const ScheduleView& view = rank.routed.tiles.up.schedule;  // the ring's rows
  const Macrobatches batches(view);
  const int rows = batches.total_blocks * gemm::kBlockM;
  const int batch_rows = batches.ring_blocks * gemm::kBlockM;
  const int last_batch_begin = (batches.count() - 1) * batch_rows;  // walked first
  const uint32_t activation_complete = 2u * static_cast<uint32_t>(rank.routed.tiles.up.n_blocks);
  const auto copy_row = ring_row_copy(world, pull, place.rank, view);
  const int32_t* route_rows = per_route ? nullptr : world.at(schedule.buffers.route_rows, place.rank);
  // Rows in the macrobatches' order: the last macrobatch, then the others from the top down.
  const int first_rows = rows - last_batch_begin;
  const auto row_of = [&](int i) {
    return i < first_rows ? last_batch_begin + i
                          : last_batch_begin - (1 + (i - first_rows) / batch_rows) * batch_rows + (i - first_rows) % batch_rows;
  };
  const auto to_pull = [&](int i) {
    const int2 entry = view.rows[row_of(i)];
    const bool on_this_gpu =
        static_cast<unsigned>(entry.x - world.first_local_rank) < static_cast<unsigned>(world.local_ranks);
    return entry.x >= 0 ? !on_this_gpu || pull_all_rows : zero_padding_rows;  // else gathered in place
  };
  return transfer::for_each_wanted_item(0, rows, warps, to_pull, [&](int i) {
    const int row = row_of(i);
    const int2 entry = view.rows[row];
    if (entry.x < 0) {  // no tile waits for it: the gather zero-fills padding rows
      zero_ring_row(world, pull, place.rank, view, row, lane);
      return true;
    }
    // The token's rows in this row's macrobatch, pulled together by the warp that meets the first.
    const int batch_begin = row / batch_rows * batch_rows;
    const transfer::TokenGroup group(route_rows, schedule.routes, pull.top_k, entry, row, batch_begin,
                                     min(batch_begin + batch_rows, rows));
    if (!group.led_by_own_row(lane)) return true;
    // Each row's ring row is free once the up/gate tiles of the block that held it have read it.
    bool ready = true;
    transfer::for_each_member(group, lane, [&](int, int member) {
      const int previous = batches.previous_in_ring(member / gemm::kBlockM);
      if (previous >= 0 && ready) {
        ready = comm::wait_ready_thread(world, place, rank.routed.activation_ready + previous, activation_complete,
                                        previous);
      }
    });
    if (!__all_sync(0xffffffffu, ready)) return false;
    __syncwarp();  // every lane's stores after the lanes' acquires
    copy_row(group, entry.x, entry.y / pull.top_k, lane);
    // Count the rows into their blocks, one release per block: every lane's stores before it.
    __syncwarp();
    transfer::for_each_slot_round(group, lane, [&](int, int member) {
      const int block = member >= 0 ? member / gemm::kBlockM : -1;
      const unsigned same_block = __match_any_sync(0xffffffffu, block);
      if (block >= 0 && lane == __ffs(same_block) - 1) {
        comm::signal_ready_thread(rank.x_ready + block, static_cast<uint32_t>(__popc(same_block)));
      }
    });
    return true;
  });
}

}  // namespace caracal::fused
