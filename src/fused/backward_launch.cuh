#pragma once
// The fused backward's kernel and launch in the precision of `Gemms` (backward_gemms.cuh), for its
// two units: backward.cu (bf16) and backward_fp8.cu (FP8), each instantiating one kernel. Per rank,
// comm CTAs count the window's dy rows that are there and pull the others (a launch that moves
// rows: Gemms::kRowsInLaunch) while the other CTAs run the dgrad+SwiGLU and dx tiles as their rows
// become ready (their idle warps copying the rows of tokens on this GPU and summing dx groups,
// where asked); the comm CTAs join them once their pulls are done. A unit supplies its precision's
// GEMM parameters per rank and its kernel's dy pull.
#include <cstdint>

#include "caracal/comm/cuda_check.hpp"
#include "caracal/error.hpp"
#include "comm/launch.cuh"
#include "fused/backward_compute.cuh"
#include "fused/backward_local_rows.cuh"
#include "fused/backward_params.cuh"
#include "fused/backward_pull.cuh"
#include "fused/dx_group_sums.cuh"
#include "fused/fused_launch.hpp"
#include "gemm/router_grad_reduce.hpp"

namespace caracal::fused {

template <class Gemms>
__global__ void __launch_bounds__(gemm::kThreads, 1)
    fused_backward_kernel(comm::DeviceWorld world, CUTE_GRID_CONSTANT BackwardKernelParams<Gemms> const p) {
  extern __shared__ uint8_t smem_raw[];
  const bool comm_cta = comm::cta_of_rank(world) < p.comm_ctas;
  if (comm_cta) pull_backward_rows(world, comm::role_place(world, 0, p.comm_ctas), p);
  if constexpr (Gemms::kRowsInLaunch) {
    if (p.local_rows_in_launch && !comm_cta) copy_local_dy_prologue(world, p);
  }
  // Every CTA computes, comm CTAs once their pulls are done: tasks come from the rank's counter.
  const comm::CtaPlace place = comm::whole_launch_place(world);
  const FusedBackwardRankParams<Gemms>& rank = p.ranks[place.local_rank];
  run_backward_tasks(world, place, rank, gemm::kernel_storage<typename Gemms::Policy>(smem_raw),
                     [&](int idle_warp) {
                       if constexpr (Gemms::kRowsInLaunch) {
                         // The rows of tokens on this GPU before the dx sums: the dx tiles the sums
                         // wait for need them.
                         if (p.local_rows_in_launch && !comm_cta) copy_local_rows(world, p, idle_warp);
                         if (rank.tiles.group_dx) {
                           sum_dx_groups(world, place, rank, p.schedule, static_cast<int>(threadIdx.x) % 32);
                         }
                       }
                     });
}

// CTAs per rank of the precision's launch on `world`'s device (one per SM, shared by the local ranks).
template <class Gemms>
int backward_ctas_per_rank(const comm::World& world, const char* name) {
  return fused_kernel_ctas_per_rank<typename Gemms::Policy>(world, fused_backward_kernel<Gemms>, name);
}

// Device words a rank of the precision's launch needs (backward_ready_counter_words).
template <class Gemms>
size_t backward_counter_words(int buffer_rows, int shared_rows) {
  RankWords words(nullptr, BackwardCounters(nullptr, buffer_rows, shared_rows).words);
  take_task_slots<BackwardTaskSlot, Gemms::Policy::kStages>(words);
  return words.words();
}

// A rank's counters and task slots in its parameters, its counters zeroed on `stream`.
template <class Gemms>
void place_backward_counters(FusedBackwardRankParams<Gemms>& r, uint32_t* ready_counters, int buffer_rows,
                             int shared_rows, cudaStream_t stream, const char* name) {
  CARACAL_CHECK(ready_counters != nullptr, name, ": ready_counters must not be null");
  const BackwardCounters counters(ready_counters, buffer_rows, shared_rows);
  r.dy_ready = counters.dy_ready;
  r.dgrad_done = counters.dgrad_done;
  r.dx_done = counters.dx_done;
  r.task_counter = counters.task_counter;
  r.sums_counter = counters.sums_counter;
  r.shared_dgrad_done = counters.shared_dgrad_done;
  RankWords words(ready_counters, counters.words);
  r.task_slots = take_task_slots<BackwardTaskSlot, Gemms::Policy::kStages>(words);
  check_cuda(cudaMemsetAsync(ready_counters, 0, counters.words * sizeof(uint32_t), stream),
             "fused backward: cudaMemsetAsync(ready counters)");
}

// The launch of `p` (its ranks' parameters set from `args`, a FusedBackwardArgs or
// FusedBackwardFp8Args), then each rank's router-score reductions of its dgrad's partials.
template <class Gemms, class Args>
void launch_fused_backward(comm::World& world, const comm::LaunchShape& shape, const BackwardKernelParams<Gemms>& p,
                           const Args& args, cudaStream_t stream, const char* name) {
  comm::launch(world, name, shape, stream, fused_backward_kernel<Gemms>, p);
  for (int l = 0; l < world.local_ranks(); ++l) {
    const auto& rank = args.ranks[static_cast<size_t>(l)];
    gemm::reduce_router_grad(rank.pass.workspace, p.ranks[l].tiles.dgrad.n_blocks, rank.pass.rows, rank.pass.dg,
                             stream, name);
    if (rank.has_shared) {
      gemm::reduce_router_grad(rank.shared.workspace, p.ranks[l].tiles.shared_dgrad.n_blocks, rank.shared.rows,
                               rank.shared.dg, stream, name);
    }
  }
}

}  // namespace caracal::fused
