// The fused forward's task table (forward_task_table.cuh): its kernel, the only one of this unit,
// and its launch.
#include <algorithm>

#include "caracal/comm/cuda_check.hpp"
#include "caracal/error.hpp"
#include "comm/launch.cuh"
#include "device/comm/cta_place.cuh"
#include "device/comm/device_world.cuh"
#include "device/comm/grid_dependency.cuh"
#include "fused/forward_task_table.cuh"

namespace caracal::fused {
namespace {

// Few CTAs a rank, since each holds registers of an SM that a fused CTA waits for, and enough
// threads that each resolves a few tasks.
constexpr int kCtasPerRank = 4;
constexpr int kThreads = 512;

// Shared memory for a schedule's offsets ([L + 1]) and counts ([L]) over L experts.
CARACAL_HOST_DEVICE size_t staged_words(int experts) { return 2 * size_t(experts) + 1; }

// `tiles`, whose up/gate and down GEMMs walk one schedule (the launcher checks), with that schedule's
// offsets and counts copied by the CTA's threads to `staged` (staged_words of them). Thread 0 writes
// the result; the caller meets the CTA before reading it.
__device__ void stage(const ExpertTiles& tiles, int32_t* staged, ExpertTiles& result) {
  const ScheduleView& rows = tiles.up.schedule;
  const int experts = rows.num_experts;
  int32_t* counts = rows.expert_count != nullptr ? staged + experts + 1 : nullptr;
  for (int e = int(threadIdx.x); e <= experts; e += kThreads) staged[e] = rows.expert_offset[e];
  if (counts != nullptr) {
    for (int e = int(threadIdx.x); e < experts; e += kThreads) counts[e] = rows.expert_count[e];
  }
  if (threadIdx.x == 0) {
    result = tiles;
    for (ScheduleView* view : {&result.up.schedule, &result.down.schedule}) {
      view->expert_offset = staged;
      view->expert_count = counts;
    }
  }
}

// Each thread resolves a run of tasks through a chain of dependent reads of the schedules' offsets
// and counts (the run's first task placed by bisection); the CTA first copies them into shared
// memory, every thread loading at once, so that the chain takes no global round trip.
__global__ void __launch_bounds__(kThreads)
    forward_task_table_kernel(comm::DeviceWorld world, __grid_constant__ const ForwardTaskTableParams p) {
  comm::allow_dependent_launch();  // the fused kernel may start: its routed tasks wait for this launch
  comm::wait_for_previous_grid();  // the schedule's launch
  const comm::CtaPlace place = comm::whole_launch_place(world);
  const ForwardTaskTableRank& r = p.ranks[place.local_rank];
  extern __shared__ int32_t staged[];  // the routed experts' schedule, then the shared expert's
  __shared__ ExpertTiles routed, shared;
  stage(r.routed, staged, routed);
  if (r.has_shared) stage(r.shared, staged + staged_words(r.routed.up.schedule.num_experts), shared);
  __syncthreads();
  ForwardTaskCursorOf<gemm::PlainLoads> tasks(r.has_shared ? &shared : nullptr, routed);
  tasks.count_routed_tasks();
  // Each thread a run of consecutive tasks: the first found by bisection, the others by the
  // cursor's walk from it (mostly within the same expert).
  const int first = tasks.shared_tasks();
  const int threads = place.count * kThreads;
  const int per_thread = (tasks.num_tasks() - first + threads - 1) / threads;
  const int begin = first + (place.index * kThreads + int(threadIdx.x)) * per_thread;
  const int end = min(begin + per_thread, tasks.num_tasks());
  for (int t = begin; t < end; ++t) store_table_task(r.table, t - first, t == begin ? tasks.at_any(t) : tasks.at(t));
}

}  // namespace

void launch_forward_task_table(comm::World& world, const ForwardTaskTableParams& params, cudaStream_t stream,
                               const char* name) {
  size_t words = 0;
  for (int l = 0; l < world.local_ranks(); ++l) {
    const ForwardTaskTableRank& r = params.ranks[l];
    for (const ExpertTiles* tiles : {&r.routed, r.has_shared ? &r.shared : nullptr}) {
      if (tiles == nullptr) continue;
      CARACAL_CHECK(tiles->up.schedule.expert_offset == tiles->down.schedule.expert_offset &&
                        tiles->up.schedule.expert_count == tiles->down.schedule.expert_count,
                    name, ": a group's up/gate and down tiles must walk one schedule (local rank ", l, ")");
    }
    words = std::max(words, staged_words(r.routed.up.schedule.num_experts) +
                                (r.has_shared ? staged_words(r.shared.up.schedule.num_experts) : 0));
  }
  comm::LaunchShape shape;
  shape.ctas_per_rank = kCtasPerRank;
  shape.threads_per_cta = kThreads;
  shape.shared_bytes = words * sizeof(int32_t);
  shape.starts_early = true;
  if (shape.shared_bytes > 48 * 1024) {  // past the default limit: raise it where the device allows
    int optin = 0;
    check_cuda(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, world.device()),
               "cudaDeviceGetAttribute");
    CARACAL_CHECK(shape.shared_bytes + 2 * sizeof(ExpertTiles) <= size_t(optin), name,
                  ": the task table copies the schedules' offsets and counts into shared memory, ",
                  shape.shared_bytes, " bytes for ", world.local_ranks() > 1 ? "the largest rank's " : "",
                  "local experts; this device allows ", optin, " a CTA");
    check_cuda(cudaFuncSetAttribute(forward_task_table_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    int(shape.shared_bytes)),
               "cudaFuncSetAttribute");
  }
  comm::launch(world, name, shape, stream, forward_task_table_kernel, params);
}

}  // namespace caracal::fused
