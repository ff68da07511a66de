#pragma once
// The fused forward's communication role: pull the rank's schedule rows (x of each route's token,
// from its home rank; padding rows zeroed) into expert_x, and count each 128-row block's rows as
// their stores complete, so that the compute CTAs start a block's tiles as soon as its rows are in.
//
// The rank's comm CTAs take its rows in turn (CTA i: rows i, i + n, ...), so the blocks fill in
// order; each CTA pulls with bulk copies from one thread (bulk_row_pull.cuh) and raises a block's
// counter once per block it leaves, by its rows of the block.
#include <cstdint>

#include "device/comm/cta_place.cuh"
#include "device/comm/device_world.cuh"
#include "device/comm/ready_flags.cuh"
#include "device/gemm/gemm_config.cuh"
#include "device/transfer/bulk_row_pull.cuh"
#include "device/transfer/pull_rows.cuh"
#include "device/transfer/schedule_rows.cuh"
#include "device/transfer/warp_work.cuh"

namespace caracal::fused {

// All threads of a comm CTA (thread 0 pulls; the others wait at the CTA barrier that follows).
__device__ inline void pull_forward_rows(const comm::DeviceWorld& world, const comm::CtaPlace& place,
                                         const transfer::ScheduleParams& schedule, const transfer::PullRows& pull,
                                         const transfer::BulkPullSmem& smem, uint32_t* x_ready) {
  transfer::bulk_pull_init(smem);
  if (threadIdx.x != 0) return;  // the caller's __syncthreads() gathers the CTA again
  const ScheduleView view = transfer::rank_schedule(world, schedule, place.rank);
  const int total = view.expert_offset[view.num_experts];
  const int rows = total > place.index ? (total - place.index + place.count - 1) / place.count : 0;
  __nv_bfloat16* expert_rows = world.at(pull.expert_rows, place.rank);
  const auto row_of = [&](int j) { return place.index + j * place.count; };

  int block = -1;  // the block whose written rows are being counted, and how many
  uint32_t written = 0;
  const auto count_block = [&] {
    if (written == 0) return;
    comm::async_proxy_fence();  // the bulk stores' writes, before the release
    comm::signal_ready_thread(x_ready + block, written);
  };
  transfer::pull_rows_bulk(
      smem, rows,
      [&](int j) -> const void* {
        const int2 entry = view.rows[row_of(j)];
        if (entry.x < 0) return nullptr;
        return world.at(pull.home_rows, entry.x) + static_cast<int64_t>(entry.y / pull.top_k) * pull.hidden;
      },
      [&](int j) -> void* { return expert_rows + static_cast<int64_t>(row_of(j)) * pull.hidden; },
      [&](int j) {
        const int b = row_of(j) / gemm::kBlockM;
        if (b != block) {
          count_block();
          block = b;
          written = 0;
        }
        ++written;
      });
  count_block();
}

// The same with every warp of the CTA copying rows (warp_copy_row_deep), rows dealt to the warps of
// the rank's comm CTAs in turn; a warp raises a block's counter once per block it leaves.
template <int kDepth>
__device__ inline void pull_forward_rows_warps(const comm::DeviceWorld& world, const comm::CtaPlace& place,
                                               const transfer::ScheduleParams& schedule,
                                               const transfer::PullRows& pull, uint32_t* x_ready) {
  const int lane = static_cast<int>(threadIdx.x) % transfer::kWarpSize;
  const transfer::WarpWorkers warps = transfer::rank_warps(place);
  const ScheduleView view = transfer::rank_schedule(world, schedule, place.rank);
  const int rows = view.expert_offset[view.num_experts];
  __nv_bfloat16* expert_rows = world.at(pull.expert_rows, place.rank);
  const int vectors = pull.hidden / transfer::kBf16PerVector;
  int block = -1;
  uint32_t pulled = 0;
  const auto count_block = [&] {
    if (pulled == 0) return;
    __syncwarp();  // every lane's stores of the block's rows before lane 0's release
    if (lane == 0) comm::signal_ready_thread(x_ready + block, pulled);
  };
  for (int row = warps.index; row < rows; row += warps.count) {
    if (row / gemm::kBlockM != block) {
      count_block();
      block = row / gemm::kBlockM;
      pulled = 0;
    }
    const int2 entry = view.rows[row];
    uint4* dst = transfer::row_vectors(expert_rows, row, pull.hidden);
    if (entry.x < 0) {
      transfer::warp_zero_row(dst, vectors, lane);
    } else {
      const __nv_bfloat16* home = world.at(pull.home_rows, entry.x);
      transfer::warp_copy_row_deep<kDepth, true>(dst, transfer::row_vectors(home, entry.y / pull.top_k, pull.hidden),
                                                 vectors, lane);
    }
    ++pulled;
  }
  count_block();
}

}  // namespace caracal::fused
