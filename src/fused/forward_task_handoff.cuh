#pragma once
// How the fused forward's producer threads learn their tasks (forward_compute.cuh) from the rank's
// task counter; a precision's GEMMs name theirs (forward_gemms.cuh: Gemms::TaskHandOff):
//   TaskPerThread       every producer thread walks the task cursor in its registers
//   TaskThroughScratch  thread 0 alone takes each task, and hands it to the others through the
//                       CTA's ProducerScratch in global memory (the FP8 forward's storage fills the
//                       227 KiB and its producer has 56 registers): a routed task from the task
//                       table (forward_task_table.cuh: one load), a shared expert's from the task
//                       cursor in the scratch; it claims each task a round ahead, so that the
//                       counter's round trip runs under the tile before
// next() meets every producer thread before thread 0 takes the next task; it returns false at the
// end, with every thread alike. `previous`: the block whose ring rows the task takes over (-1: none).
#include <new>

#include "device/comm/device_world.cuh"
#include "device/comm/grid_dependency.cuh"
#include "device/gemm/gathered_rows.cuh"
#include "fused/forward_task_table.cuh"
#include "fused/forward_tasks.cuh"
#include "fused/task_slots.cuh"

namespace caracal::fused {

class TaskPerThread {
 public:
  static constexpr bool kReadsTaskTable = false;

  template <class Rank>
  __device__ TaskPerThread(const Rank& p, const comm::DeviceWorld&, int)
      : tasks_(p.has_shared ? &p.shared.tiles : nullptr, p.routed.tiles) {}

  template <class Rank>
  __device__ bool next(const Rank& p, const comm::DeviceWorld&, int thread, ForwardTask& task, int& previous) {
    if (thread == 0) word() = static_cast<int>(atomicAdd(p.task_counter, 1u));
    gemm::gather_threads_sync();
    const int t = word();
    if (t >= tasks_.shared_tasks() && !tasks_.routed_counted()) {  // every producer thread alike
      comm::wait_for_previous_grid();  // the schedule's launch (fused_forward.hpp)
      tasks_.count_routed_tasks();
    }
    // Meets every thread before thread 0 writes the next task.
    if (gemm::gather_threads_count(t >= tasks_.num_tasks()) > 0) return false;
    task = tasks_.at(t);
    previous = task.shared() ? -1 : tasks_.macrobatches().previous_in_ring(task.m_block());
    return true;
  }
  template <class Rank>
  __device__ const Macrobatches& macrobatches(const Rank&, const comm::DeviceWorld&) const {
    return tasks_.macrobatches();
  }
  template <class Rank>
  __device__ ForwardTask slot_task(const Rank&, const comm::DeviceWorld&, const ForwardTask& task) const {
    return task;
  }

 private:
  __device__ static int& word() {
    __shared__ int task_number;
    return task_number;
  }
  ForwardTaskCursor tasks_;
};


class TaskThroughScratch {
 public:
  static constexpr bool kReadsTaskTable = true;  // the launch writes the table first (forward_launch.cuh)

  template <class Rank>
  __device__ TaskThroughScratch(const Rank& p, const comm::DeviceWorld& world, int thread) {
    if (thread == 0) {
      new (&scratch(p, world).cursor) ForwardTaskCursor(p.has_shared ? &p.shared.tiles : nullptr, p.routed.tiles);
      claimed_ = static_cast<int>(atomicAdd(p.task_counter, 1u));
    }
  }

  template <class Rank>
  __device__ bool next(const Rank& p, const comm::DeviceWorld& world, int thread, ForwardTask& task, int& previous) {
    const int buffer = round_ % 2;
    if (thread == 0) {  // the next task, or the end
      ForwardTaskCursor& tasks = scratch(p, world).cursor;
      // Claims stay in increasing order per CTA, so the smallest unfinished task is one its claimer
      // runs (that CTA's task before it is smaller, hence done): forward_tasks.cuh's rule holds. A task
      // claimed here waits behind this CTA's current tile; one past the end is claimed for nothing.
      const int t = claimed_;
      claimed_ = static_cast<int>(atomicAdd(p.task_counter, 1u));
      if (t >= tasks.shared_tasks() && !tasks.routed_counted()) {
        comm::wait_for_previous_grid();  // the schedule's launch (fused_forward.hpp)
        tasks.count_routed_tasks();
      }
      ForwardTask next{ForwardPhase::end, {}};
      int next_previous = -1;
      if (t < tasks.num_tasks()) {
        next = t < tasks.shared_tasks() ? tasks.at(t) : table_task(p.task_table, t - tasks.shared_tasks());
        if (!next.shared()) next_previous = tasks.macrobatches().previous_in_ring(next.m_block());
      }
      scratch(p, world).task[buffer] = next;
      scratch(p, world).previous[buffer] = next_previous;
    }
    gemm::gather_threads_sync();  // thread 0's task written; every thread is past the round before
    task = handed(scratch(p, world).task[buffer]);
    if (task.phase == ForwardPhase::end) return false;
    ++round_;
    previous = *const_cast<const volatile int*>(&scratch(p, world).previous[buffer]);
    if (!task.shared() && !schedule_built_) {  // every producer thread, before it reads the schedule
      comm::wait_for_previous_grid();
      schedule_built_ = true;
    }
    return true;
  }
  template <class Rank>
  __device__ const Macrobatches& macrobatches(const Rank& p, const comm::DeviceWorld& world) const {
    return scratch(p, world).cursor.macrobatches();
  }
  // The task of this round as thread 0 wrote it, read again from the scratch: the fields only the
  // consumers read are not held in the producer's registers.
  template <class Rank>
  __device__ ForwardTask slot_task(const Rank& p, const comm::DeviceWorld& world, const ForwardTask&) const {
    return handed(scratch(p, world).task[(round_ - 1) % 2]);
  }

 private:
  // Found again at each use (a fresh %ctaid.x read): not held in two registers across the tiles.
  template <class Rank>
  __device__ static ProducerScratch& scratch(const Rank& p, const comm::DeviceWorld& world) {
    return p.producer_scratch[cta_in_rank(world)];
  }
  // A task thread 0 wrote into the scratch, read after the producer threads met.
  __device__ static ForwardTask handed(const ForwardTask& slot) {
    static_assert(sizeof(ForwardTask) % sizeof(int) == 0);
    ForwardTask task;
    const volatile int* from = reinterpret_cast<const volatile int*>(&slot);
    int* to = reinterpret_cast<int*>(&task);
    for (int i = 0; i < int(sizeof(ForwardTask) / sizeof(int)); ++i) to[i] = from[i];
    return task;
  }
  int round_ = 0;
  int claimed_ = 0;  // thread 0's: the task of the next round
  bool schedule_built_ = false;  // this thread has waited for the schedule's launch
};

}  // namespace caracal::fused
