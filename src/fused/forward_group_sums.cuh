#pragma once
// The fused forward's group sums: combine's expert side (src/device/transfer/group_sum.cuh) inside
// the launch, for the macrobatches walked before the last (those whose output rows the next
// macrobatch overwrites; macrobatch 0's wait in the ring for the combine launch, which sums them on
// every SM). A group_sums task (forward_tasks.cuh) covers one 128-row block of a macrobatch: for
// each row there that leads its token group (the token's rows on this rank in the macrobatch), one
// warp waits until the down tiles of every member's block have stored their output rows, sums the
// members' rows weighted by g in slot order, rounds once and stores the sum into the home slot of
// the leader's route — one row per (token, rank, macrobatch) over the links. The consumer
// warpgroups of a compute CTA run it (kGroupSumWarps warps, rows dealt in turn) while the producer
// streams the next tiles' operands. g is computed from the home's topk scores (router_math.cuh),
// as build_schedule computes the gates buffer.
#include <cuda_bf16.h>

#include "device/comm/cta_place.cuh"
#include "device/comm/device_world.cuh"
#include "device/comm/ready_flags.cuh"
#include "device/gemm/gemm_config.cuh"
#include "device/transfer/group_sum.cuh"
#include "fused/forward_params.cuh"

namespace caracal::fused {

// The warps that sum a block's groups: both consumer warpgroups'.
inline constexpr int kGroupSumWarps = 2 * gemm::kWarpgroupThreads / 32;

// One warp (`warp` of `warps`) on a group_sums task (forward_tasks.cuh): the groups led by rows of
// its block. Returns false when a wait failed (timeout or aborted world, recorded).
template <class Gemms>
__device__ inline bool sum_block_groups(const comm::DeviceWorld& world, const comm::CtaPlace& place,
                                        const FusedForwardRankParams<Gemms>& p,
                                        const transfer::ScheduleParams& schedule, const GroupSumParams& sums,
                                        int hidden, bool per_route, const gemm::TileCoord& task, int warp, int warps,
                                        int lane) {
  const ScheduleView& view = p.routed.tiles.up.schedule;
  const uint32_t stored = 2u * static_cast<uint32_t>(p.routed.tiles.down.n_blocks);
  const int32_t* route_rows = per_route ? nullptr : world.at(schedule.buffers.route_rows, place.rank);
  for (int row = task.m_begin + warp; row < task.m_begin + gemm::kBlockM; row += warps) {
    const int2 entry = view.rows[row];
    if (entry.x < 0) continue;  // padding
    const transfer::TokenGroup group(route_rows, schedule.routes, schedule.top_k, entry, row, task.k_begin,
                                     task.active_end);
    if (!group.led_by_own_row(lane)) continue;
    bool ready = true;
    transfer::for_each_member(group, lane, [&](int, int member) {
      const int member_block = member / gemm::kBlockM;
      if (ready) ready = comm::wait_ready_thread(world, place, p.out_stored + member_block, stored, member_block);
    });
    if (!__all_sync(~0u, ready)) return false;
    __syncwarp();  // every lane's loads after the lanes' acquires
    const int first_route = group.route(0);
    const float* scores = world.at(sums.topk_scores, entry.x) + first_route;
    const transfer::GroupGates gates{
        transfer::warp_gate_factor(world.at(schedule.buffers.topk_idx, entry.x) + first_route, scores,
                                   schedule.num_experts, schedule.top_k, sums.scaling, lane),
        scores};
    transfer::warp_store_group_sum<true, 2>(
        group, gates,
        [&](int member) { return transfer::row_vectors(p.out_rows, view.buffer_row(member), hidden); },
        transfer::row_vectors(world.at(sums.home_slots, entry.x), entry.y, hidden), hidden / transfer::kBf16PerVector,
        lane);
  }
  return true;
}

}  // namespace caracal::fused
