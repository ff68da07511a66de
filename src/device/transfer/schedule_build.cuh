#pragma once
// The schedule table built on the GPU (DESIGN §2): the device blocks, and build_schedule() which
// chains them for one rank; the placement is the host twin's (schedule.hpp), bit for bit. Work
// units: a chunk of kScheduleChunkRoutes consecutive routes (token*k + slot) of one source rank is
// one warp's, kChunkSteps steps of 32 routes (lane i: route 32*step + i); a block of kBlockChunks
// consecutive chunks is one CTA's (its warp w takes chunk w). Four phases, world barriers between:
// reset, pull and count, scan, place (each function below says its phase). Determinism: a route's
// index j among its source's routes to its expert is its block's scanned count + the block's
// earlier chunks' counts + a per-warp running base over the chunk's earlier steps + the lower lanes
// of its step with the same expert (__match_any_sync + popc): integers summed in a fixed order, no
// atomics, nothing timing-dependent.
#include <cstdint>

#include "caracal/transfer/exchange_shape.hpp"
#include "device/comm/device_sync.cuh"
#include "device/comm/device_world.cuh"
#include "device/transfer/device_params.hpp"
#include "device/transfer/routing_fault.cuh"
#include "device/transfer/row_copy.cuh"
#include "device/transfer/warp_work.cuh"

namespace caracal::transfer::schedule {

inline constexpr int kChunkRoutes = static_cast<int>(kScheduleChunkRoutes);
inline constexpr int kChunkSteps = kChunkRoutes / kWarpSize;
static_assert(kChunkSteps * kWarpSize == kChunkRoutes, "a chunk is a whole number of warp steps");
inline constexpr int kBlockChunks = static_cast<int>(kScheduleBlockChunks);
static_assert(kBlockChunks * kWarpSize == kScheduleThreads, "a CTA's warps take a block's chunks, one each");

// Ints of dynamic shared memory build_schedule() needs per CTA of `warps` warps.
__host__ __device__ constexpr int64_t shared_ints(int64_t num_experts, int64_t local_experts, int64_t warps) {
  return num_experts + 2 * local_experts + 1 + warps * local_experts;
}

// One CTA's view of its rank's layout, in shared memory.
struct SharedLayout {
  int* source_count;  // [L][W] routes per (local expert, source)
  int* expert_count;  // [L]
  int* offset;        // [L + 1] padded segment offsets
  int* warp_counts;   // [warps][L] every warp's per-expert counters
  int* warp_scratch;  // [L] this warp's row of warp_counts
};

__device__ inline SharedLayout carve_shared(int* shared, const ScheduleParams& p, int warp) {
  SharedLayout layout;
  layout.source_count = shared;
  layout.expert_count = layout.source_count + p.num_experts;  // L * W = E
  layout.offset = layout.expert_count + p.local_experts;
  layout.warp_counts = layout.offset + p.local_experts + 1;
  layout.warp_scratch = layout.warp_counts + warp * p.local_experts;
  return layout;
}

// Row of the j-th route from `source` within its expert's segment, given every source's count:
// sum_q min(c_q, j) + #{q < source : c_q > j} (the round-robin deal of DESIGN §2).
__device__ __forceinline__ int round_robin_row(const int* count, int world_size, int source, int j) {
  int row = 0;
  for (int q = 0; q < world_size; ++q) {
    const int c = count[q];
    row += min(c, j) + (q < source && c > j ? 1 : 0);
  }
  return row;
}

// Phase 0, before the barrier that opens phase 1 (nothing processes this rank's routes yet): this
// rank's route_location table to {-1, -1}; peers fill it in phase 3.
__device__ inline void reset_route_locations(const comm::DeviceWorld& world, int rank, const ScheduleParams& p, int thread,
                                             int threads) {
  int2* location = world.at(p.buffers.route_location, rank);
  for (int r = thread; r < p.routes; r += threads) location[r] = make_int2(-1, -1);
}

// Phase 1, one warp: pulls chunk `chunk` of `source`'s topk_idx, keeps each route's local expert
// (or -1) in route_rows and counts the chunk's routes per local expert into `counts`, the warp's [L]
// scratch (all zero for a chunk past the source's last).
__device__ inline void pull_and_count_chunk(const comm::DeviceWorld& world, int rank, const ScheduleParams& p, int source,
                                            int chunk, int* counts, int lane) {
  for (int e = lane; e < p.local_experts; e += kWarpSize) counts[e] = 0;
  __syncwarp();  // counts are zeroed
  if (chunk >= p.chunks) return;
  const int first_expert = rank * p.local_experts;
  const int32_t* ids = world.at(p.buffers.topk_idx, source);
  int32_t* route_rows = world.at(p.buffers.route_rows, rank) + static_cast<int64_t>(source) * p.routes;
  const int begin = chunk * kChunkRoutes;
  int32_t id[kChunkSteps];  // all loads of the chunk in flight at once
#pragma unroll
  for (int step = 0; step < kChunkSteps; ++step) {
    const int route = begin + step * kWarpSize + lane;
    id[step] = route < p.routes ? ids[route] : -1;
  }
#pragma unroll
  for (int step = 0; step < kChunkSteps; ++step) {
    const int route = begin + step * kWarpSize + lane;
    const int32_t expert = id[step];
    const bool valid = is_valid_slot(expert, p.num_experts);
    const unsigned invalid = __ballot_sync(~0u, !valid);
    if (invalid != 0u && lane == __ffs(invalid) - 1) {  // one report per step: faults are rare
      report_expert_out_of_range(p.fault, rank, source, route, p.top_k, expert, p.num_experts);
    }
    const bool ours = valid && expert >= first_expert && expert < first_expert + p.local_experts;
    const int local = ours ? expert - first_expert : -1;
    if (route < p.routes) route_rows[route] = local;  // phase 3 turns it into the row
    const unsigned same = __match_any_sync(~0u, local);
    if (local >= 0 && lane == kWarpSize - 1 - __clz(same)) counts[local] += __popc(same);  // one lane per expert
    __syncwarp();  // the next step's updates come after this one's
  }
}

// Phase 1, the threads of the CTA whose warps have just counted block `block` of `source` (after
// __syncthreads): per local expert, each chunk's count of the routes in the block's earlier chunks
// into chunk_counts, and the block's total into block_counts.
__device__ inline void write_block_counts(const comm::DeviceWorld& world, int rank, const ScheduleParams& p, int source,
                                          int block, const SharedLayout& layout) {
  const int L = p.local_experts;
  const int first_chunk = block * kBlockChunks;
  const int chunks = min(kBlockChunks, p.chunks - first_chunk);
  int* chunk_out = world.at(p.buffers.chunk_counts, rank) + (static_cast<int64_t>(source) * p.chunks + first_chunk) * L;
  int* block_out = world.at(p.buffers.block_counts, rank) + (static_cast<int64_t>(source) * p.blocks + block) * L;
  for (int e = static_cast<int>(threadIdx.x); e < L; e += static_cast<int>(blockDim.x)) {
    int earlier = 0;
    for (int w = 0; w < chunks; ++w) {
      const int n = layout.warp_counts[w * L + e];
      chunk_out[w * L + e] = earlier;
      earlier += n;
    }
    block_out[e] = earlier;
  }
}

// The inclusive prefix sum of `value` over the warp (lane i gets the sum of lanes 0..i). All lanes.
__device__ __forceinline__ int warp_inclusive_sum(int value, int lane) {
  for (int d = 1; d < kWarpSize; d <<= 1) {
    const int below = __shfl_up_sync(~0u, value, d);
    if (lane >= d) value += below;
  }
  return value;
}

// Phase 2, one warp: the exclusive prefix sums of column (source, e) of this rank's block counts,
// in place, and the column's total into source_count[e][source]. Loads of up to kScanRounds x 32
// blocks are in flight at once.
inline constexpr int kScanRounds = 4;
__device__ inline void scan_block_column(const comm::DeviceWorld& world, int rank, const ScheduleParams& p, int column,
                                         int lane) {
  const int L = p.local_experts;
  const int source = column / L;
  const int e = column % L;
  int* counts = world.at(p.buffers.block_counts, rank) + static_cast<int64_t>(source) * p.blocks * L + e;
  int carry = 0;
  for (int first = 0; first < p.blocks; first += kScanRounds * kWarpSize) {
    int n[kScanRounds];
#pragma unroll
    for (int r = 0; r < kScanRounds; ++r) {
      const int b = first + r * kWarpSize + lane;
      n[r] = b < p.blocks ? counts[static_cast<int64_t>(b) * L] : 0;
    }
#pragma unroll
    for (int r = 0; r < kScanRounds; ++r) {
      const int b = first + r * kWarpSize + lane;
      const int inclusive = warp_inclusive_sum(n[r], lane);
      if (b < p.blocks) counts[static_cast<int64_t>(b) * L] = carry + inclusive - n[r];
      carry += __shfl_sync(~0u, inclusive, kWarpSize - 1);
    }
  }
  if (lane == 0) world.at(p.buffers.source_count, rank)[e * p.world_size + source] = carry;
}

// Phase 3, all threads of the CTA: this rank's counts and segment offsets into shared memory.
__device__ inline void load_layout(const comm::DeviceWorld& world, int rank, const ScheduleParams& p,
                                   const SharedLayout& layout) {
  const int L = p.local_experts;
  const int W = p.world_size;
  const int32_t* source_count = world.at(p.buffers.source_count, rank);
  for (int i = static_cast<int>(threadIdx.x); i < W * L; i += static_cast<int>(blockDim.x)) {
    layout.source_count[i] = source_count[i];
  }
  __syncthreads();
  // Warp 0: exclusive prefix sum of the padded counts, 32 experts at a time.
  if (threadIdx.x < kWarpSize) {
    const int lane = static_cast<int>(threadIdx.x);
    if (lane == 0) layout.offset[0] = 0;
    int carry = 0;
    for (int base = 0; base < L; base += kWarpSize) {
      const int e = base + lane;
      int padded = 0;
      if (e < L) {
        int n = 0;
        for (int q = 0; q < W; ++q) n += layout.source_count[e * W + q];
        layout.expert_count[e] = n;
        padded = (n + p.tile_m - 1) / p.tile_m * p.tile_m;
      }
      const int inclusive = warp_inclusive_sum(padded, lane);
      if (e < L) layout.offset[e + 1] = carry + inclusive;
      carry += __shfl_sync(~0u, inclusive, kWarpSize - 1);
    }
  }
  __syncthreads();
}

// Phase 3, the threads of one CTA per rank: the layout as the schedule's outputs (source_count
// was written by the scan).
__device__ inline void publish_layout(const comm::DeviceWorld& world, int rank, const ScheduleParams& p,
                                      const SharedLayout& layout) {
  const int L = p.local_experts;
  int32_t* offset = world.at(p.buffers.expert_offset, rank);
  int32_t* count = world.at(p.buffers.expert_count, rank);
  for (int i = static_cast<int>(threadIdx.x); i <= L; i += static_cast<int>(blockDim.x)) offset[i] = layout.offset[i];
  for (int i = static_cast<int>(threadIdx.x); i < L; i += static_cast<int>(blockDim.x))
    count[i] = layout.expert_count[i];
}

// Phase 3, this rank's warps: padding rows {-1, -1} at the end of every segment.
__device__ inline void pad_segments(const comm::DeviceWorld& world, int rank, const ScheduleParams& p, const SharedLayout& layout,
                                    WarpWorkers workers, int lane) {
  int2* rows = world.at(p.buffers.rows, rank);
  for (int e = workers.index; e < p.local_experts; e += workers.count) {
    for (int r = layout.offset[e] + layout.expert_count[e] + lane; r < layout.offset[e + 1]; r += kWarpSize) {
      rows[r] = make_int2(-1, -1);
    }
  }
}

// Phase 3, one warp: places chunk `chunk` (of block `block`) of `source`'s routes, each kept route's
// local expert in route_rows replaced by its row, rows[row] = {source, route} and, in the source's
// table, route_location[route] = {rank, row}. `next_j` is the warp's [L] scratch: per expert, the
// index j of the source's next route to it, starting from the scanned block count plus the block's
// earlier chunks' count. Nothing to do for a chunk past the source's last.
__device__ inline void place_chunk(const comm::DeviceWorld& world, int rank, const ScheduleParams& p, int source,
                                   int block, int chunk, const SharedLayout& layout, int* next_j, int lane) {
  if (chunk >= p.chunks) return;
  const int L = p.local_experts;
  const int* in_block = world.at(p.buffers.chunk_counts, rank) + (static_cast<int64_t>(source) * p.chunks + chunk) * L;
  const int* before_block =
      world.at(p.buffers.block_counts, rank) + (static_cast<int64_t>(source) * p.blocks + block) * L;
  for (int e = lane; e < L; e += kWarpSize) next_j[e] = before_block[e] + in_block[e];
  int32_t* route_rows = world.at(p.buffers.route_rows, rank) + static_cast<int64_t>(source) * p.routes;
  const int begin = chunk * kChunkRoutes;
  int32_t local[kChunkSteps];
#pragma unroll
  for (int step = 0; step < kChunkSteps; ++step) {
    const int route = begin + step * kWarpSize + lane;
    local[step] = route < p.routes ? route_rows[route] : -1;
  }
  __syncwarp();  // next_j is initialized
  int2* rows = world.at(p.buffers.rows, rank);
  int2* home_location = world.at(p.buffers.route_location, source);
  const unsigned lower_lanes = (1u << lane) - 1u;
#pragma unroll
  for (int step = 0; step < kChunkSteps; ++step) {
    const int route = begin + step * kWarpSize + lane;
    const int e = local[step];
    const unsigned same = __match_any_sync(~0u, e);
    if (e >= 0) {
      const int j = next_j[e] + __popc(same & lower_lanes);
      const int row =
          layout.offset[e] + round_robin_row(layout.source_count + e * p.world_size, p.world_size, source, j);
      rows[row] = make_int2(source, route);
      route_rows[route] = row;  // this lane read the entry above, and no other lane reads it
      home_location[route] = make_int2(rank, row);
    }
    __syncwarp();  // every lane has read next_j[e] before its update
    if (e >= 0 && lane == kWarpSize - 1 - __clz(same)) next_j[e] += __popc(same);
    __syncwarp();
  }
}

// The whole builder for `place`'s rank. Every CTA of the role calls it (it holds four world
// barriers, two in a world of one rank) with kScheduleThreads threads and shared_ints(E, L,
// kBlockChunks) ints at `shared`;
// `local_work(thread, threads)` runs on every thread after the entry barrier (work on this rank's
// own buffers that peers may read until then: the gates). Inputs: every rank's topk_idx,
// written before the launch. False after a timed-out barrier (recorded by the comm layer): the
// caller returns.
template <typename LocalWork>
__device__ inline bool build_schedule(const comm::DeviceWorld& world, const comm::CtaPlace& place,
                                      const ScheduleParams& p, int* shared, LocalWork&& local_work) {
  const int rank = place.rank;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int thread = place.index * static_cast<int>(blockDim.x) + static_cast<int>(threadIdx.x);
  const int threads = place.count * static_cast<int>(blockDim.x);
  const WarpWorkers warps = rank_warps(place);
  const SharedLayout layout = carve_shared(shared, p, warp);
  const int items = p.world_size * p.blocks;  // (source, block), source-major, a CTA each

  // In a world of one rank, stream order publishes topk_idx before the launch and the routes'
  // locations after it, and barriers 2 and 3 order the reset before the placement: the entry and
  // exit barriers are for peers.
  const bool peers = p.world_size > 1;
  reset_route_locations(world, rank, p, thread, threads);
  // Every rank's topk_idx is published and its route table reset before anyone reads or pushes.
  if (peers && !comm::world_barrier(world, place)) return false;
  for (int item = place.index; item < items; item += place.count) {
    const int source = item / p.blocks;
    const int block = item % p.blocks;
    pull_and_count_chunk(world, rank, p, source, block * kBlockChunks + warp, layout.warp_scratch, lane);
    __syncthreads();  // the block's counts are in shared memory
    write_block_counts(world, rank, p, source, block, layout);
    __syncthreads();  // and read before the next block's overwrite them
  }
  local_work(thread, threads);
  // This rank's route_rows (local experts), chunk and block counts are complete.
  if (!comm::world_barrier(world, place)) return false;
  for (int column = warps.index; column < p.world_size * p.local_experts; column += warps.count) {
    scan_block_column(world, rank, p, column, lane);
  }
  // Every column is scanned and totalled.
  if (!comm::world_barrier(world, place)) return false;
  load_layout(world, rank, p, layout);
  if (place.index == 0) publish_layout(world, rank, p, layout);
  pad_segments(world, rank, p, layout, warps, lane);
  for (int item = place.index; item < items; item += place.count) {
    const int source = item / p.blocks;
    const int block = item % p.blocks;
    place_chunk(world, rank, p, source, block, block * kBlockChunks + warp, layout, layout.warp_scratch, lane);
  }
  // Every route location has landed in its home rank's table.
  return !peers || comm::world_barrier(world, place);
}

}  // namespace caracal::transfer::schedule
