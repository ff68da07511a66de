#pragma once
// Parameters of the exchange's device blocks, as plain data that host launchers fill in.
#include <cuda_bf16.h>

#include <cstdint>

#include "caracal/comm/symmetric_ptr.hpp"
#include "caracal/transfer/exchange_buffers.hpp"
#include "caracal/transfer/exchange_shape.hpp"
#include "caracal/transfer/routing_fault.hpp"

namespace caracal::transfer {

// What the schedule builder (schedule_build.cuh) needs; sizes as in exchange_shape.hpp.
struct ScheduleParams {
  int routes = 0;  // T * k
  int top_k = 0;
  int num_experts = 0;    // E
  int local_experts = 0;  // L
  int world_size = 0;     // W
  int tile_m = 0;
  int chunks = 0;  // ceil(routes / kScheduleChunkRoutes)
  int blocks = 0;  // ceil(chunks / kScheduleBlockChunks)
  int row_capacity = 0;  // the most rows a rank's schedule can have (TokenExchange::schedule_view)
  ScheduleBuffers buffers;
  RoutingFaultSink fault;
};

// The schedule rows [first_row, end_row) a pull (dispatch, reverse combine) fills, into buffer
// row r % ring_rows over a ring (ring_rows > 0; the window then lies in one macrobatch), else r.
struct PullWindow {
  int first_row = 0;
  int end_row = 0;
  int ring_rows = 0;
  RowsInPlace in_place = RowsInPlace::kNone;  // real rows the pull leaves as they are
  bool barrier = true;                        // the launch's entry world barrier (PullRange)
};

// What combine's expert side pushes home (group_sum.cuh): the sums of token groups within windows
// of group_rows schedule rows (0: the whole schedule, one group per (token, rank)) over the
// schedule rows [0, end_row) (and below expert_offset[L]), schedule row r read from buffer row r of
// `rows`: v1's expert_out, all rows; after the fused forward, expert_dy's ring rows holding
// macrobatch 0, end_row = group_rows = the ring's rows.
// y_out[l]: where local rank l's y goes (the caller's buffer), or, where null, the exchange's y.
struct CombinePush {
  comm::SymmetricPtr<__nv_bfloat16> rows;
  int end_row = 0;
  int group_rows = 0;
  __nv_bfloat16* y_out[kMaxCombineOutputs] = {};
};

// The router normalization of DESIGN §1 in the precision the kernels use.
struct RouterScaling {
  float scale = 1.0f;
  bool normalize = true;
};

}  // namespace caracal::transfer
