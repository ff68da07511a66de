// combine per (token, rank) (group_sum.cuh): the expert side sums each token group's rows
// (args.combine: v1's expert_out, or the rows of macrobatch 0 that the fused forward left in
// expert_dy's ring) weighted by g and pushes one row into the home slot of the group's leader
// route; after one barrier each home rank sums its tokens' leader slots in slot order onto the
// shared expert's output, into the caller's y buffers when given (CombinePush::y_out).
#include <climits>

#include "device/comm/device_sync.cuh"
#include "device/transfer/group_sum.cuh"
#include "device/transfer/schedule_rows.cuh"
#include "device/transfer/slot_reduce.cuh"
#include "device/transfer/warp_work.cuh"
#include "transfer/exchange_launch.hpp"

namespace caracal::transfer::detail {
namespace {

// 24 warps per SM. With top_k < kMaxStagedRows (every preset) both sums stage their loads through
// shared memory (staged_row_sum.cuh: 8 KiB a warp, 15 loads in flight); beyond, the register
// versions keep four (group sums) or eight (home sums) rows in flight.

__global__ void __launch_bounds__(kReduceThreads, 1) combine_kernel(comm::DeviceWorld world, ExchangeArgs args) {
  const comm::CtaPlace place = comm::whole_launch_place(world);
  const WarpWorkers warps = role_warps(world, place);
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  extern __shared__ uint4 combine_stages[];
  uint4* const stage = warp_stage(combine_stages);
  const bool staged = args.top_k < kMaxStagedRows;
  const ScheduleBuffers& schedule = args.schedule.buffers;
  const CombinePush& push = args.combine;
  // No home rank is still summing its slots in an earlier combine.
  if (!comm::world_barrier(world, place)) return;
  const PullWindow rows{0, push.end_row > 0 ? push.end_row : INT_MAX};
  for_each_window_row(world, args.schedule, rows, warps, [&](int rank, int row, int2 entry) {
    if (entry.x < 0) return;  // padding
    const int window_begin = push.group_rows > 0 ? row / push.group_rows * push.group_rows : 0;
    const int window_end = push.group_rows > 0 ? window_begin + push.group_rows : INT_MAX;
    const TokenGroup group(args.rows_per_route ? nullptr : world.at(schedule.route_rows, rank), args.schedule.routes,
                           args.top_k, entry, row, window_begin, window_end);
    if (!group.led_by_own_row(lane)) return;
    const int64_t first_route = group.route(0);
    const float* scores = world.at(args.router.topk_scores, entry.x) + first_route;
    const GroupGates gates{warp_gate_factor(world.at(schedule.topk_idx, entry.x) + first_route, scores,
                                            args.num_experts, args.top_k, args.scaling, lane),
                           scores};
    const __nv_bfloat16* out = world.at(push.rows, rank);
    const auto row_of = [&](int member) { return row_vectors(out, member, args.hidden); };
    uint4* const dst = row_vectors(world.at(args.forward.combine_slots, entry.x), entry.y, args.hidden);
    if (staged) {
      warp_store_group_sum_staged(group, gates, row_of, dst, args.hidden / kBf16PerVector, stage, lane);
    } else {
      warp_store_group_sum<false, 4>(group, gates, row_of, dst, args.hidden / kBf16PerVector, lane);
    }
  });
  // Every leader slot of every home rank has been written (the fused forward's earlier
  // macrobatches' before this launch).
  if (!comm::world_barrier(world, place)) return;
  for_each_local_token(world, args.tokens, warps, [&](int rank, int token) {
    const int64_t first_route = static_cast<int64_t>(token) * args.top_k;
    const LeaderSlots leaders(world.at(schedule.route_location, rank) + first_route,
                              world.at(schedule.topk_idx, rank) + first_route, args.num_experts, args.top_k,
                              SlotGroups{push.group_rows, args.rows_per_route}, lane);
    const uint4* slots = row_vectors(world.at(args.forward.combine_slots, rank), first_route, args.hidden);
    const uint4* shared =
        args.has_shared ? row_vectors(world.at(args.forward.shared_out, rank), token, args.hidden) : nullptr;
    __nv_bfloat16* const y_out = push.y_out[rank - world.first_local_rank];  // else the exchange's y
    uint4* const y = row_vectors(y_out != nullptr ? y_out : world.at(args.forward.y, rank), token, args.hidden);
    if (staged) {
      reduce_token_slots_staged(leaders, args.top_k, slots, shared, y, args.hidden / kBf16PerVector, stage, lane);
    } else {
      const int vectors = args.hidden / kBf16PerVector;
      reduce_token_slots(
          leaders, args.top_k, [&](int slot) { return slots + static_cast<int64_t>(slot) * vectors; }, shared, y,
          vectors, lane);
    }
  });
}

}  // namespace

comm::LaunchShape combine_launch_shape(comm::World& world, int sm_budget, const ExchangeShape& exchange,
                                       const ExchangeSizes& sizes) {
  comm::LaunchShape shape;
  shape.threads_per_cta = kReduceThreads;
  shape.shared_bytes = staged_sum_shared_bytes(shape.threads_per_cta);
  allow_shared_bytes(combine_kernel, shape.shared_bytes,
                     "cudaFuncSetAttribute(combine_kernel, MaxDynamicSharedMemorySize)");
  const int max_ctas = comm::max_ctas_per_rank(world, combine_kernel, shape.threads_per_cta, shape.shared_bytes);
  // A warp per row while pushing, a warp per token while summing.
  const int64_t items = std::max(sizes.row_capacity, exchange.tokens);
  shape.ctas_per_rank = ctas_for_items(world, sm_budget, max_ctas, items, kReduceThreads / kWarpSize);
  return shape;
}

void launch_combine(comm::World& world, const comm::LaunchShape& shape, const ExchangeArgs& args, cudaStream_t stream) {
  comm::launch(world, "TokenExchange::combine", shape, stream, combine_kernel, args);
}

}  // namespace caracal::transfer::detail
