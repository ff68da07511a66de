// device_task_table (task_table_test_kernels.hpp).
#include "task_table_test_kernels.hpp"

#include <cuda_runtime.h>

#include <memory>

#include "caracal/comm/cuda_check.hpp"
#include "caracal/comm/loopback_world.hpp"
#include "fused/forward_task_table.cuh"

namespace caracal::test {
namespace {

// Device copies of the schedules' arrays, freed with it.
struct DeviceArrays {
  std::vector<void*> owned;
  ~DeviceArrays() {
    for (void* p : owned) cudaFree(p);
  }
  template <class T>
  T* copy(const T* host, size_t count) {
    void* device = nullptr;
    check_cuda(cudaMalloc(&device, count * sizeof(T) + 1), "cudaMalloc");
    owned.push_back(device);
    check_cuda(cudaMemcpy(device, host, count * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy");
    return static_cast<T*>(device);
  }
  // `tiles` over device copies of its schedule's offsets and counts (both GEMMs walk one schedule).
  fused::ExpertTiles on_device(const fused::ExpertTiles& tiles) {
    const ScheduleView& rows = tiles.up.schedule;
    const int32_t* offsets = copy(rows.expert_offset, size_t(rows.num_experts) + 1);
    const int32_t* counts = rows.expert_count != nullptr ? copy(rows.expert_count, size_t(rows.num_experts)) : nullptr;
    fused::ExpertTiles result = tiles;
    for (ScheduleView* view : {&result.up.schedule, &result.down.schedule}) {
      view->expert_offset = offsets;
      view->expert_count = counts;
    }
    return result;
  }
};

}  // namespace

std::vector<fused::ForwardTask> device_task_table(const fused::ExpertTiles* shared, const fused::ExpertTiles& routed,
                                                  size_t entries) {
  comm::LoopbackWorld world(1, size_t(1) << 20);
  DeviceArrays arrays;
  fused::ForwardTaskTableParams params{};
  fused::ForwardTaskTableRank& r = params.ranks[0];
  r.routed = arrays.on_device(routed);
  r.has_shared = shared != nullptr;
  if (shared != nullptr) r.shared = arrays.on_device(*shared);
  void* table = nullptr;
  check_cuda(cudaMalloc(&table, entries * sizeof(fused::ForwardTask) + 1), "cudaMalloc(table)");
  arrays.owned.push_back(table);
  check_cuda(cudaMemset(table, 0xff, entries * sizeof(fused::ForwardTask)), "cudaMemset(table)");
  r.table = static_cast<fused::ForwardTask*>(table);
  fused::launch_forward_task_table(world, params, nullptr, "task table test");
  check_cuda(cudaDeviceSynchronize(), "the task table's launch");
  std::vector<fused::ForwardTask> result(entries);
  check_cuda(cudaMemcpy(result.data(), table, entries * sizeof(fused::ForwardTask), cudaMemcpyDeviceToHost),
             "cudaMemcpy(table)");
  return result;
}

}  // namespace caracal::test
