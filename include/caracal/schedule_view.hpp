#pragma once
// One rank's schedule as every kernel reads it (DESIGN §2): which routes its rows hold and how the
// rows group by local expert. The transfers read `rows` (where each row comes from and goes home
// to); the grouped GEMMs' tile schedulers read the grouping only. Plain data over device memory,
// valid in host and device code; the host fills it in, never reading through it.
#include <vector_types.h>  // int2

#include <cstdint>

namespace caracal {

struct ScheduleView {
  // expert_offset starts at 0, never decreases, holds multiples of 128 and ends at most at
  // row_capacity; expert_count[e] <= expert_offset[e + 1] - expert_offset[e] (the rest of a segment
  // is padding). The kernels cannot check this on the host, which never learns the counts.
  const int32_t* expert_offset = nullptr;  // [L + 1] first row of each local expert's segment
  const int32_t* expert_count = nullptr;   // [L] real routes per local expert; GEMMs: optional
                                           // (nullptr: no skipping of padding halves)
  int num_experts = 0;                     // L, >= 1
  int row_capacity = 0;                    // schedule rows there can be; a multiple of 128
  // Schedule row r (the r-th of the expert-contiguous order) lives in buffer row buffer_row(r) of
  // the row buffers (expert_x, gate_up, ..., expert_dx). ring_rows = 0: each schedule row has its
  // own (MoELayer v1's buffers, sized for the worst case, its launches over the whole schedule at
  // once). ring_rows > 0: a ring of that many rows, a multiple of 128 (a 128-row block never
  // wraps), holding the fused layer's macrobatches (DESIGN §3), each at most ring_rows consecutive
  // schedule rows, walked by the fused forward's kernel and the backward's launches a window at a time.
  int ring_rows = 0;
  const int2* rows = nullptr;              // [row_capacity] {src_rank, src_route = token * k + slot},
                                           // padding rows {-1, -1}; only the transfers read it
  // [first_row, end_row) (multiples of 128): the window of schedule rows the standalone GEMMs work
  // on. The row-tile GEMMs make only its rows' tiles; the weight gradients reduce only over its rows
  // (continuing from, or stopping at, a partial sum where an expert's rows go on outside it:
  // grouped_gemm_backward.hpp). Over a ring a window is one macrobatch or part of one: first_row a
  // multiple of ring_rows, end_row at most ring_rows further, so its rows sit in buffer rows
  // [0, end_row - first_row).
  int first_row = 0;
  int end_row = 0;  // 0: to the end of the schedule

#if defined(__CUDACC__)
  __host__ __device__
#endif
  int buffer_row(int schedule_row) const {
    return ring_rows > 0 ? schedule_row % ring_rows : schedule_row;
  }

  // Rows of each row buffer: the ring's, or one per schedule row.
#if defined(__CUDACC__)
  __host__ __device__
#endif
  int buffer_rows() const {
    return ring_rows > 0 ? ring_rows : row_capacity;
  }
};

}  // namespace caracal
