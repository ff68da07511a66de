#pragma once
// The fused forward's routed tasks as a table in global memory, read by TaskThroughScratch
// (forward_task_handoff.cuh): a small launch between the schedule's and the fused kernel's resolves
// every routed task of the order (forward_tasks.cuh) once, so that a producer takes each with one
// load instead of walking the task cursor through the schedule's offsets. Entry i is task shared_tasks() + i; the entries
// past the last task are not written. The shared expert's tasks need no schedule and stay with the
// cursor (the fused kernel runs them while this launch waits for the schedule).
//
// Launch order on the stream: the schedule's launch, this one, the fused kernel; this one and the
// fused kernel start early (programmatic dependent launch): this one lets the fused kernel start at
// once, and waits for the schedule itself; the fused kernel's routed tasks wait for this launch to
// complete, hence for the schedule too. It waits on nothing of the fused kernel (no deadlock while
// the fused kernel's last CTAs wait for its SMs).
#include <cuda_runtime.h>

#include <cstddef>
#include <cstring>

#include "caracal/comm/world.hpp"
#include "caracal/gemm/gemm_tiles.hpp"
#include "device/gemm/tile_shape.hpp"
#include "fused/forward_tasks.cuh"
#include "fused/fused_forward.hpp"

namespace caracal::fused {

// Tasks a table holds for `row_capacity` schedule rows whose up/gate and down GEMMs have
// `up_n_blocks` and `down_n_blocks` N blocks: every row block's tiles and group sums.
inline size_t forward_task_table_entries(int row_capacity, int up_n_blocks, int down_n_blocks) {
  return size_t(row_capacity > 0 ? row_capacity / gemm::kBlockM : 0) * size_t(up_n_blocks + down_n_blocks + 1);
}

// The same for experts of hidden size D and intermediate size I: both precisions' forward tiles
// are 256 wide (the up/gate GEMM's N is 2I, the down GEMM's D).
inline size_t forward_task_table_entries_of_shape(int row_capacity, int hidden, int intermediate) {
  constexpr int kTileN = gemm::kBf16Tile.n;
  static_assert(gemm::kFp8WideTile.n == kTileN, "one table size for both precisions' forwards");
  const auto blocks = [](int n) { return n > 0 ? (n + kTileN - 1) / kTileN : 0; };
  return forward_task_table_entries(row_capacity, blocks(2 * intermediate), blocks(hidden));
}

// Table entry `i`, read from L2 (written by the table's launch, which completed before the read).
__device__ inline ForwardTask table_task(const ForwardTask* table, int i) {
  static_assert(sizeof(ForwardTask) == 2 * sizeof(int4));
  const int4* entry = reinterpret_cast<const int4*>(table + i);
  const int4 lo = __ldcg(entry), hi = __ldcg(entry + 1);
  ForwardTask task;
  memcpy(&task, &lo, sizeof(lo));
  memcpy(reinterpret_cast<char*>(&task) + sizeof(lo), &hi, sizeof(hi));
  return task;
}

// Writes entry `i` (the table's launch).
__device__ inline void store_table_task(ForwardTask* table, int i, const ForwardTask& task) {
  int4 lo, hi;
  memcpy(&lo, &task, sizeof(lo));
  memcpy(&hi, reinterpret_cast<const char*>(&task) + sizeof(lo), sizeof(hi));
  int4* entry = reinterpret_cast<int4*>(table + i);
  entry[0] = lo;
  entry[1] = hi;
}

struct ForwardTaskTableRank {
  ExpertTiles shared;  // only with has_shared
  ExpertTiles routed;
  bool has_shared;
  ForwardTask* table;  // forward_task_table_entries(routed rows' capacity, ...) entries
};

struct ForwardTaskTableParams {
  ForwardTaskTableRank ranks[kFusedMaxLocalRanks];
};

// Launches forward_task_table_kernel (forward_task_table.cu) for `world`'s local ranks on `stream`,
// right before the fused kernel's launch (starting early: it waits for the schedule's launch itself).
void launch_forward_task_table(comm::World& world, const ForwardTaskTableParams& params, cudaStream_t stream,
                               const char* name);

}  // namespace caracal::fused
