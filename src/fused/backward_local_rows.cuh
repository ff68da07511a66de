#pragma once
// The fused backward's copies of the rows of tokens on this GPU inside the launch
// (BackwardKernelParams::local_rows_in_launch), in the CTAs that are not comm CTAs: every warp copies
// the dy rows of the window's first kPrologueBlocks blocks before the CTA's tiles start (so that
// the first wave of dgrad tiles finds rows), then the three warps that each CTA's producer thread
// leaves idle (warpgroup 0's warps 1-3) copy the rest under the tiles; each into the ring with its
// g, in row order, kLocalRowsPerItem rows an item, raising their block's dy_ready by the rows
// copied. Then, with pull_x, the idle warps copy the window's x rows the weight gradients read
// after the launch (no counter: the stream orders them). A copy without a deadline (x) hides under
// the tiles; dy's, which the dgrad tiles wait on, is why the prologue copies the first blocks' dy
// on every warp first.
//
// Row order, not token order: a warp reads a token's dy once per row (k times a window, mostly from
// L2) instead of once, so that block b is complete once the items up to its last row are copied.
// The same rows and bits as TokenExchange::reverse_combine and dispatch over the window.
#include <cstdint>

#include "device/comm/cta_place.cuh"
#include "device/comm/device_world.cuh"
#include "device/comm/ready_flags.cuh"
#include "device/gemm/gemm_config.cuh"
#include "device/transfer/pull_rows.cuh"
#include "device/transfer/row_copy.cuh"
#include "device/transfer/warp_work.cuh"
#include "fused/backward_params.cuh"
#include "fused/backward_pull.cuh"

namespace caracal::fused {

// Rows a warp copies before it raises their block's count once (a divisor of kBlockM: an item never
// straddles two blocks).
inline constexpr int kLocalRowsPerItem = 4;
static_assert(gemm::kBlockM % kLocalRowsPerItem == 0, "an item of rows lies in one block");
using gemm::kIdleWarpsPerCta;  // the warps of a compute CTA that copy: warpgroup 0's warps 1-3
// Blocks of dy rows every warp copies before the tiles (16 and 32 measured alike, 64 and 0 worse).
inline constexpr int kPrologueBlocks = 16;
inline constexpr int kPrologueRows = kPrologueBlocks * gemm::kBlockM;

// One warp: dy rows [first, first + kLocalRowsPerItem) of the window that the idle warps copy.
template <class Gemms>
__device__ inline void copy_local_dy_item(const comm::DeviceWorld& world, const comm::CtaPlace& place,
                                          const BackwardKernelParams<Gemms>& p, const FusedBackwardRankParams<Gemms>& rank,
                                          int first, int end_row, int lane) {
  const ScheduleView& view = rank.tiles.dgrad.schedule;
  const transfer::PullRows& pull = p.dy_pull;
  __nv_bfloat16* const expert_rows = world.at(pull.expert_rows, place.rank);
  float* const expert_gates = world.at(pull.expert_gates, place.rank);
  const int vectors = pull.hidden / transfer::kBf16PerVector;
  uint32_t copied = 0;
  for (int row = first; row < min(first + kLocalRowsPerItem, end_row); ++row) {
    const int2 entry = view.rows[row];
    if (dy_row_source(world, entry, p) != DyRowSource::kIdleWarps) continue;
    if (lane == 0) expert_gates[row] = world.at(pull.home_gates, entry.x)[entry.y];
    uint4* const dst = transfer::row_vectors(expert_rows, view.buffer_row(row), pull.hidden);
    const uint4* const src = transfer::row_vectors(world.at(pull.home_rows, entry.x), entry.y / pull.top_k, pull.hidden);
    transfer::warp_copy_row<true>(dst, src, vectors, lane);
    ++copied;
  }
  if (copied == 0) return;
  __syncwarp();  // every lane's stores before the count
  if (lane == 0) comm::signal_ready_thread(rank.dy_ready + view.buffer_row(first) / gemm::kBlockM, copied);
}

// Every warp of a CTA that is not a comm CTA, before its tiles: the first prologue rows.
template <class Gemms>
__device__ inline void copy_local_dy_prologue(const comm::DeviceWorld& world, const BackwardKernelParams<Gemms>& p) {
  const comm::CtaPlace place = comm::role_place(world, p.comm_ctas, world.ctas_per_rank - p.comm_ctas);
  const int lane = static_cast<int>(threadIdx.x) % transfer::kWarpSize;
  const FusedBackwardRankParams<Gemms>& rank = p.ranks[place.local_rank];
  const ScheduleView& view = rank.tiles.dgrad.schedule;
  const int end_row = min(min(view.end_row, view.expert_offset[view.num_experts]), view.first_row + kPrologueRows);
  const int warps_per_cta = static_cast<int>(blockDim.x) / transfer::kWarpSize;
  const transfer::WarpWorkers warps{place.index * warps_per_cta + static_cast<int>(threadIdx.x) / transfer::kWarpSize,
                                    place.count * warps_per_cta};
  for (int first = view.first_row + warps.index * kLocalRowsPerItem; first < end_row;
       first += warps.count * kLocalRowsPerItem) {
    copy_local_dy_item(world, place, p, rank, first, end_row, lane);
  }
}

// One idle warp (`idle_warp` in [0, kIdleWarpsPerCta)) of a CTA that is not a comm CTA.
template <class Gemms>
__device__ inline void copy_local_rows(const comm::DeviceWorld& world, const BackwardKernelParams<Gemms>& p,
                                       int idle_warp) {
  const comm::CtaPlace place = comm::role_place(world, p.comm_ctas, world.ctas_per_rank - p.comm_ctas);
  const int lane = static_cast<int>(threadIdx.x) % transfer::kWarpSize;
  const FusedBackwardRankParams<Gemms>& rank = p.ranks[place.local_rank];
  const ScheduleView& view = rank.tiles.dgrad.schedule;
  const int end_row = min(view.end_row, view.expert_offset[view.num_experts]);
  // The rank's warps take items in row order, so the blocks fill in order.
  const transfer::WarpWorkers warps{place.index * kIdleWarpsPerCta + idle_warp, place.count * kIdleWarpsPerCta};
  for (int first = view.first_row + kPrologueRows + warps.index * kLocalRowsPerItem; first < end_row;
       first += warps.count * kLocalRowsPerItem) {
    copy_local_dy_item(world, place, p, rank, first, end_row, lane);
  }
  if (p.pull_x) {
    // Every local rank's idle warps share all local ranks' x rows.
    const transfer::WarpWorkers all{(place.local_rank * place.count + place.index) * kIdleWarpsPerCta + idle_warp,
                                    world.local_ranks * place.count * kIdleWarpsPerCta};
    transfer::pull_schedule_rows<false, true>(world, p.schedule, p.x_window, all, p.x_pull, p.rows_per_route);
  }
}

}  // namespace caracal::fused
