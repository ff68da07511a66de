#pragma once
// The fused forward's task table (src/fused/forward_task_table.cuh) as its launch writes it, behind
// a host function so the GoogleTest source stays plain C++.
#include <cstddef>
#include <vector>

#include "fused/forward_tasks.cuh"

namespace caracal::test {

// `routed` and `shared` (null: no shared expert) name their schedules' offsets and counts in host
// memory; copied to the GPU, they go to launch_forward_task_table on a one-rank loopback world,
// over a table of `entries` entries whose bytes are 0xff before the launch. Returns the table.
std::vector<fused::ForwardTask> device_task_table(const fused::ExpertTiles* shared, const fused::ExpertTiles& routed,
                                                  size_t entries);

}  // namespace caracal::test
