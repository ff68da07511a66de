#pragma once
// One rank's schedule as every kernel reads it (DESIGN §2): which routes its rows hold and how the
// rows group by local expert. The transfers read `rows` (where each row comes from and goes home
// to); the grouped GEMMs' tile schedulers read the grouping only. Plain data over device memory,
// valid in host and device code; the host fills it in, never reading through it.
//
// Schedule rows and buffer rows. Row r of the schedule is the r-th row of its expert-contiguous
// order; the row buffers (expert_x, gate_up, ..., expert_dx) hold it in buffer row
// buffer_row(r). With ring_rows = 0 every schedule row has its own buffer row: MoELayer v1's
// buffers, sized for the worst case, over which its launches run the whole schedule at once. With
// ring_rows > 0 the buffers form a ring of that many rows and schedule row r lives in buffer row
// r % ring_rows: the fused layer's macrobatches (DESIGN §3), each at most ring_rows consecutive
// rows, walked by the fused forward's kernel and by the backward's launches one window at a time.
// ring_rows is a multiple of 128 (the GEMM tile), so a 128-row block never wraps.
//
// [first_row, end_row) (multiples of 128; end_row 0: no end) is the window of schedule rows the
// standalone GEMMs work on: the row-tile GEMMs make only the tiles of its rows, the weight
// gradients reduce only over its rows (continuing from, or stopping at, a partial sum where an
// expert's rows go on outside it: grouped_gemm_backward.hpp). Over a ring (ring_rows > 0) a window
// is one macrobatch or part of one: first_row a multiple of ring_rows, end_row at most ring_rows
// further, so its rows sit in buffer rows [0, end_row - first_row). The backward walks the ring
// this way, macrobatch by macrobatch.
//
// Rules (the kernels cannot check them on the host, which never learns the counts): expert_offset
// [L + 1] starts at 0, never decreases, holds multiples of 128 and ends at most at row_capacity;
// expert_count[e] <= expert_offset[e + 1] - expert_offset[e] (the rest of a segment is padding).
#include <vector_types.h>  // int2

#include <cstdint>

namespace caracal {

struct ScheduleView {
  const int32_t* expert_offset = nullptr;  // [L + 1] first row of each local expert's segment
  const int32_t* expert_count = nullptr;   // [L] real routes per local expert; GEMMs: optional
                                           // (nullptr: no skipping of padding halves)
  int num_experts = 0;                     // L, >= 1
  int row_capacity = 0;                    // schedule rows there can be; a multiple of 128
  int ring_rows = 0;                       // 0: buffer row = schedule row; else rows of the ring
  const int2* rows = nullptr;              // [row_capacity] {src_rank, src_route = token * k + slot},
                                           // padding rows {-1, -1}; only the transfers read it
  int first_row = 0;                       // the standalone GEMMs' window of rows (see above)
  int end_row = 0;                         // 0: to the end of the schedule

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
