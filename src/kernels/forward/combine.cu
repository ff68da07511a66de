// combine: the expert side pushes its output rows into their home slots; after one barrier each
// home rank sums its tokens' slots in slot order, weighted by g, onto the shared expert's output.
// Without the push (kPush false) when the fused forward's down tiles filled the slots already.
#include "device/comm/device_sync.cuh"
#include "device/transfer/schedule_rows.cuh"
#include "device/transfer/slot_reduce.cuh"
#include "device/transfer/push_rows.cuh"
#include "device/transfer/warp_work.cuh"
#include "transfer/exchange_launch.hpp"

namespace caracal::transfer::detail {
namespace {

// 24 warps per SM: the slot sums keep kSlotsInFlight rows in flight (~80 registers) without spilling.

template <bool kPush>
__global__ void __launch_bounds__(kReduceThreads, 1)
    combine_kernel(comm::DeviceWorld world, ExchangeArgs args) {
  const comm::CtaPlace place = comm::whole_launch_place(world);
  const WarpWorkers warps = role_warps(world, place);
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const ScheduleBuffers& schedule = args.schedule.buffers;
  if constexpr (kPush) {
    // No home rank is still summing its slots in an earlier combine.
    if (!comm::world_barrier(world, place)) return;
    for_each_schedule_row(world, args.schedule, warps, [&](int rank, int row, int2 entry) {
      push_slot_row(world, entry,
                    row_vectors(world.at(args.forward.expert_out, rank), row, args.hidden), args.forward.combine_slots,
                    args.hidden, lane);
    });
  }
  // Every routed slot of every home rank has been written.
  if (!comm::world_barrier(world, place)) return;
  for_each_local_token(world, args.tokens, warps, [&](int rank, int token) {
    const int64_t first_route = static_cast<int64_t>(token) * args.top_k;
    reduce_token_slots<true>(
        world.at(schedule.topk_idx, rank) + first_route, world.at(args.router.gates, rank) + first_route,
        args.num_experts, args.top_k, row_vectors(world.at(args.forward.combine_slots, rank), first_route, args.hidden),
        args.has_shared ? row_vectors(world.at(args.forward.shared_out, rank), token, args.hidden) : nullptr,
        row_vectors(world.at(args.forward.y, rank), token, args.hidden), args.hidden / kBf16PerVector, lane);
  });
}

}  // namespace

comm::LaunchShape combine_launch_shape(comm::World& world, int sm_budget, const ExchangeShape& exchange,
                                       const ExchangeSizes& sizes, bool push) {
  comm::LaunchShape shape;
  shape.threads_per_cta = kReduceThreads;
  const int max_ctas = push ? comm::max_ctas_per_rank(world, combine_kernel<true>, shape.threads_per_cta)
                            : comm::max_ctas_per_rank(world, combine_kernel<false>, shape.threads_per_cta);
  // A warp per row while pushing, a warp per token while summing.
  const int64_t items = push ? std::max(sizes.row_capacity, exchange.tokens) : exchange.tokens;
  shape.ctas_per_rank = ctas_for_items(world, sm_budget, max_ctas, items, kReduceThreads / kWarpSize);
  return shape;
}

void launch_combine(comm::World& world, const comm::LaunchShape& shape, const ExchangeArgs& args, cudaStream_t stream) {
  comm::launch(world, "TokenExchange::combine", shape, stream, combine_kernel<true>, args);
}

void launch_combine_filled_slots(comm::World& world, const comm::LaunchShape& shape, const ExchangeArgs& args,
                                 cudaStream_t stream) {
  comm::launch(world, "TokenExchange::combine_filled_slots", shape, stream, combine_kernel<false>, args);
}

}  // namespace caracal::transfer::detail
