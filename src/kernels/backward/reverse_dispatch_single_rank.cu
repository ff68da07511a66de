// reverse_dispatch when the world has one rank: each token's dx and d topk_scores in one pass, the
// same bits as reverse_dispatch.cu's push, barrier and sums. A token's dx rows are read where they
// are (kFromExpertRows: expert_dx's rows, found through route_location, instead of a copy into the
// home slots; else the dx slots the dx GEMM filled), and its dL/dg straight from expert_dg into
// its dg slots, which the same warp then reads. The tokens' rows are cut into chunks of 32 vectors
// and every warp takes an equal run of consecutive chunks (warp_work.cuh); it never waits on
// another CTA, so it takes every SM.
#include "device/transfer/router_math.cuh"
#include "device/transfer/routing_fault.cuh"
#include "device/transfer/slot_reduce.cuh"
#include "device/transfer/warp_work.cuh"
#include "transfer/exchange_launch.hpp"

namespace caracal::transfer::detail {
namespace {

template <bool kFromExpertRows>
__global__ void __launch_bounds__(kReduceThreads, 1)
    reverse_dispatch_single_rank_kernel(comm::DeviceWorld world, ExchangeArgs args) {
  const int rank = world.first_local_rank;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const BackwardBuffers& backward = args.backward;
  const int2* locations = world.at(args.schedule.buffers.route_location, rank);
  for_each_token_run(args.tokens, args.hidden / kBf16PerVector, [&](int token, int first, int end) {
    const int64_t first_route = static_cast<int64_t>(token) * args.top_k;
    const int32_t* ids = world.at(args.schedule.buffers.topk_idx, rank) + first_route;
    if (first == 0) {  // the warp holding the token's first chunk
      float* dg = world.at(backward.dg_slots, rank) + first_route;
      for (int slot = lane; slot < args.top_k; slot += kWarpSize) {
        if (is_routed(ids[slot], args.num_experts)) {
          dg[slot] = world.at(backward.expert_dg, rank)[locations[first_route + slot].y];
        }
      }
      __syncwarp();  // the lanes' dg stores, before every lane reads them
      token_score_gradients(ids, world.at(args.router.topk_scores, rank) + first_route, dg, args.num_experts,
                            args.top_k, args.scaling, world.at(args.router.d_topk_scores, rank) + first_route, lane);
    }
    const auto row_of = [&](int slot) {
      if constexpr (kFromExpertRows) {
        return row_vectors(world.at(backward.expert_dx, rank), locations[first_route + slot].y, args.hidden) + first;
      } else {
        return row_vectors(world.at(backward.dx_slots, rank), first_route + slot, args.hidden) + first;
      }
    };
    reduce_token_slots(
        [&](int slot) { return is_routed(__ldg(ids + slot), args.num_experts); }, args.top_k, row_of,
        args.has_shared ? row_vectors(world.at(backward.shared_dx, rank), token, args.hidden) + first : nullptr,
        row_vectors(world.at(backward.dx, rank), token, args.hidden) + first, end - first, lane);
  });
}

}  // namespace

comm::LaunchShape reverse_dispatch_single_rank_launch_shape(comm::World& world, const ExchangeShape& exchange) {
  return single_rank_launch_shape(world, exchange, kReduceThreads, 0, reverse_dispatch_single_rank_kernel<true>,
                                  reverse_dispatch_single_rank_kernel<false>);
}

void launch_reverse_dispatch_single_rank(comm::World& world, const comm::LaunchShape& shape, const ExchangeArgs& args,
                                         cudaStream_t stream, bool push_dx) {
  if (push_dx) {
    comm::launch(world, "TokenExchange::reverse_dispatch", shape, stream, reverse_dispatch_single_rank_kernel<true>,
                 args);
  } else {
    comm::launch(world, "TokenExchange::reverse_dispatch_filled_dx_slots", shape, stream,
                 reverse_dispatch_single_rank_kernel<false>, args);
  }
}

}  // namespace caracal::transfer::detail
