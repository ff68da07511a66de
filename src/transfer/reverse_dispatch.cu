// reverse_dispatch: the expert side pushes each row's dx and dL/dg into their home slots; after
// one barrier each home rank sums its tokens' dx slots in slot order onto the shared expert's dx
// and turns dL/dg into d topk_scores through the normalization's Jacobian. Without the push of dx
// rows (kPushDx false) when the dx GEMM stored them home already (fused::gate_up_dgrad_to_home),
// and then, where the fused backward summed other ranks' rows per (token, rank) first (kGroupedDx),
// only those groups' leader slots and the rank's own route slots.
#include <algorithm>

#include "device/comm/device_sync.cuh"
#include "device/transfer/group_sum.cuh"
#include "device/transfer/router_math.cuh"
#include "device/transfer/schedule_rows.cuh"
#include "device/transfer/slot_reduce.cuh"
#include "device/transfer/push_rows.cuh"
#include "device/transfer/warp_work.cuh"
#include "transfer/exchange_launch.hpp"

namespace caracal::transfer::detail {
namespace {

// 24 warps per SM: the slot sums keep kSlotsInFlight rows in flight (~80 registers) without spilling.

// A token's dx is summed in slices of this many vectors (4 KiB of a row), each by its own warp:
// one warp per token left most warps idle at the end (at W = 1 each summed one or two of
// DeepSeek-V3's 8 x 14 KiB slot sets). A vector's sum is the same whichever slice it is in.
inline constexpr int kSliceVectors = 256;
// The slices of a row of `hidden` values.
__host__ __device__ constexpr int slices_of_row(int64_t hidden) {
  return static_cast<int>((hidden / kBf16PerVector + kSliceVectors - 1) / kSliceVectors);
}

// kGroupedDx: the dx slots of tokens on other ranks hold a sum per (token, rank, window)
// (ExchangeArgs::dx_group_rows), only the leader slots are summed; else every routed slot.
template <bool kPushDx, bool kGroupedDx>
__global__ void __launch_bounds__(kReduceThreads, 1)
    reverse_dispatch_kernel(comm::DeviceWorld world, ExchangeArgs args) {
  const comm::CtaPlace place = comm::whole_launch_place(world);
  // No home rank is still summing its slots in an earlier reverse dispatch (without the dx push,
  // the launch that filled the dx slots came after a barrier that follows it).
  if (kPushDx && !comm::world_barrier(world, place)) return;
  const WarpWorkers warps = role_warps(world, place);
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const ScheduleBuffers& schedule = args.schedule.buffers;
  const BackwardBuffers& backward = args.backward;
  for_each_schedule_row(world, args.schedule, warps, [&](int rank, int row, int2 entry) {
    if (entry.x >= 0 && lane == 0)
      world.at(backward.dg_slots, entry.x)[entry.y] = world.at(backward.expert_dg, rank)[row];
    if constexpr (kPushDx) {
      push_slot_row(world, entry, row_vectors(world.at(backward.expert_dx, rank), row, args.hidden),
                    backward.dx_slots, args.hidden, lane);
    }
  });
  // Every routed slot of every home rank has been written.
  if (!comm::world_barrier(world, place)) return;
  const int vectors = args.hidden / kBf16PerVector;
  const int slices = slices_of_row(args.hidden);
  for_each_local_item(
      world, warps, [&](int) { return args.tokens * slices; },
      [&](int rank, int item) {
        const int token = item / slices, first = item % slices * kSliceVectors;  // the slice's first vector
        const int64_t first_route = static_cast<int64_t>(token) * args.top_k;
        const int32_t* ids = world.at(schedule.topk_idx, rank) + first_route;
        if (first == 0) {
          token_score_gradients(ids, world.at(args.router.topk_scores, rank) + first_route,
                                world.at(backward.dg_slots, rank) + first_route, args.num_experts, args.top_k,
                                args.scaling, world.at(args.router.d_topk_scores, rank) + first_route, lane);
        }
        const uint4* slots = row_vectors(world.at(backward.dx_slots, rank), first_route, args.hidden) + first;
        const auto sum_slots = [&](auto&& summed) {
          reduce_token_slots(
              summed, args.top_k, [&](int slot) { return slots + static_cast<int64_t>(slot) * vectors; },
              args.has_shared ? row_vectors(world.at(backward.shared_dx, rank), token, args.hidden) + first : nullptr,
              row_vectors(world.at(backward.dx, rank), token, args.hidden) + first, min(kSliceVectors, vectors - first),
              lane);
        };
        if constexpr (kGroupedDx) {
          const SlotGroups groups{args.dx_group_rows, false, /*last_row_leads=*/true, rank};
          sum_slots(LeaderSlots(world.at(schedule.route_location, rank) + first_route, ids, args.num_experts,
                                args.top_k, groups, lane));
        } else {
          sum_slots([&](int slot) { return is_routed(__ldg(ids + slot), args.num_experts); });
        }
      });
}

}  // namespace

comm::LaunchShape reverse_dispatch_launch_shape(comm::World& world, int sm_budget, const ExchangeShape& exchange,
                                                const ExchangeSizes& sizes) {
  comm::LaunchShape shape;
  shape.threads_per_cta = kReduceThreads;
  const int max_ctas =
      std::min({comm::max_ctas_per_rank(world, reverse_dispatch_kernel<true, false>, shape.threads_per_cta),
                comm::max_ctas_per_rank(world, reverse_dispatch_kernel<false, false>, shape.threads_per_cta),
                comm::max_ctas_per_rank(world, reverse_dispatch_kernel<false, true>, shape.threads_per_cta)});
  // A warp per row while pushing, a warp per token slice while summing.
  const int64_t items = std::max(sizes.row_capacity, exchange.tokens * slices_of_row(exchange.hidden));
  shape.ctas_per_rank = ctas_for_items(world, sm_budget, max_ctas, items, kReduceThreads / kWarpSize);
  return shape;
}

void launch_reverse_dispatch(comm::World& world, const comm::LaunchShape& shape, const ExchangeArgs& args,
                             cudaStream_t stream, bool push_dx) {
  if (push_dx) {
    comm::launch(world, "TokenExchange::reverse_dispatch", shape, stream, reverse_dispatch_kernel<true, false>, args);
  } else if (args.dx_group_rows >= 0) {
    comm::launch(world, "TokenExchange::reverse_dispatch_filled_dx_slots", shape, stream,
                 reverse_dispatch_kernel<false, true>, args);
  } else {
    comm::launch(world, "TokenExchange::reverse_dispatch_filled_dx_slots", shape, stream,
                 reverse_dispatch_kernel<false, false>, args);
  }
}

}  // namespace caracal::transfer::detail
