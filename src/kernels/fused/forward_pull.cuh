#pragma once
// The fused forward's communication role: pull the rank's schedule rows whose tokens live on other
// GPUs (x of each such route's token, from its home rank) into expert_x, and count each 128-row
// block's pulled rows as they land. Rows of tokens on this GPU (all of them in a loopback world, the
// rank's own at W = 1) and padding rows are not copied: the GEMM producer gathers them where they
// are (forward_compute.cuh).
//
// Every warp of the rank's comm CTAs copies rows (token_rows.cuh, as v1's dispatch), the rows dealt
// to the warps in turn, so the blocks fill in order; a warp raises a block's counter once per block
// it leaves, by the rows it pulled there. Measured on the H200 (docs/PERF.md, 2026-12-01): a comm
// CTA of warp copies moves ~92 GB/s (read + written) alone; bulk asynchronous copies through shared
// memory from one thread moved half that (each row holds a stage until its store completes).
#include <cstdint>

#include "device/comm/cta_place.cuh"
#include "device/comm/device_world.cuh"
#include "device/comm/ready_flags.cuh"
#include "device/gemm/gemm_config.cuh"
#include "device/transfer/token_rows.cuh"
#include "device/transfer/pull_rows.cuh"
#include "device/transfer/schedule_rows.cuh"
#include "device/transfer/warp_work.cuh"

namespace caracal::fused {

// All threads of a comm CTA.
__device__ inline void pull_forward_rows(const comm::DeviceWorld& world, const comm::CtaPlace& place,
                                               const transfer::ScheduleParams& schedule,
                                               const transfer::PullRows& pull, uint32_t* x_ready) {
  const int lane = static_cast<int>(threadIdx.x) % transfer::kWarpSize;
  const transfer::WarpWorkers warps = transfer::rank_warps(place);
  const ScheduleView view = transfer::rank_schedule(world, schedule, place.rank);
  const int rows = view.expert_offset[view.num_experts];
  __nv_bfloat16* expert_rows = world.at(pull.expert_rows, place.rank);
  int block = -1;
  uint32_t pulled = 0;
  const auto count_block = [&] {
    if (pulled == 0) return;
    __syncwarp();  // every lane's stores of the block's rows before lane 0's release
    if (lane == 0) comm::signal_ready_thread(x_ready + block, pulled);
  };
  for (int row = warps.index; row < rows; row += warps.count) {
    const int2 entry = view.rows[row];
    const bool on_this_gpu =
        static_cast<unsigned>(entry.x - world.first_local_rank) < static_cast<unsigned>(world.local_ranks);
    if (entry.x < 0 || on_this_gpu) continue;  // gathered in place
    if (row / gemm::kBlockM != block) {
      count_block();
      block = row / gemm::kBlockM;
      pulled = 0;
    }
    transfer::pull_token_row<true>(world, entry, pull.home_rows, pull.top_k, pull.hidden,
                                   transfer::row_vectors(expert_rows, row, pull.hidden), lane);
    ++pulled;
  }
  count_block();
}

}  // namespace caracal::fused
