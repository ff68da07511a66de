// The fused forward's task table (forward_task_table.cuh): its kernel, the only one of this unit,
// and its launch.
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

__global__ void __launch_bounds__(kThreads)
    forward_task_table_kernel(comm::DeviceWorld world, __grid_constant__ const ForwardTaskTableParams p) {
  comm::allow_dependent_launch();  // the fused kernel may start: its routed tasks wait for this launch
  comm::wait_for_previous_grid();  // the schedule's launch
  const comm::CtaPlace place = comm::whole_launch_place(world);
  const ForwardTaskTableRank& r = p.ranks[place.local_rank];
  ForwardTaskCursor tasks(r.has_shared ? &r.shared : nullptr, r.routed);
  tasks.count_routed_tasks();
  // Each thread a run of consecutive tasks: the first found by bisection, the others by the
  // cursor's walk from it (mostly within the same expert).
  const int first = tasks.shared_tasks();
  const int threads = place.count * kThreads;
  const int per_thread = (tasks.num_tasks() - first + threads - 1) / threads;
  const int begin = first + (place.index * kThreads + int(threadIdx.x)) * per_thread;
  const int end = min(begin + per_thread, tasks.num_tasks());
  for (int t = begin; t < end; ++t) r.table[t - first] = t == begin ? tasks.at_any(t) : tasks.at(t);
}

}  // namespace

void launch_forward_task_table(comm::World& world, const ForwardTaskTableParams& params, cudaStream_t stream,
                               const char* name) {
  comm::LaunchShape shape;
  shape.ctas_per_rank = kCtasPerRank;
  shape.threads_per_cta = kThreads;
  shape.starts_early = true;
  comm::launch(world, name, shape, stream, forward_task_table_kernel, params);
}

}  // namespace caracal::fused
