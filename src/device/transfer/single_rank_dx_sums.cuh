#pragma once
// Reverse dispatch in a world of one rank, by token: each token's dx = its shared-expert row + its
// routed rows in slot order (slot_reduce.cuh) and its d topk_scores, in one pass, the same bits
// as reverse_dispatch.cu's push, barrier and sums. A token's dx rows are read where they are
// (kFromExpertRows: expert_dx's rows, found through route_location, instead of a copy into the
// home slots; else the dx slots the dx GEMM filled), and its dL/dg straight from expert_dg into its
// dg slots, which the same warp then reads. The tokens' rows are cut into chunks of 32 vectors and
// the warps of `workers` take equal runs of consecutive chunks (warp_work.cuh); no warp waits on
// another, so any set of warps may run it: every warp of reverse_dispatch_single_rank.cu's launch,
// or the idle producer warps of a weight-gradient kernel that runs after the dx rows are stored
// (src/fused/weight_grad_dx_sums.cuh).
#include "device/comm/device_world.cuh"
#include "device/transfer/exchange_args.hpp"
#include "device/transfer/router_math.cuh"
#include "device/transfer/routing_fault.cuh"
#include "device/transfer/slot_reduce.cuh"
#include "device/transfer/warp_work.cuh"

namespace caracal::transfer::detail {

// `kInFlight`: the slot rows a lane loads at a time (reduce_token_slots).
template <bool kFromExpertRows, int kInFlight = kSlotsInFlight>
__device__ __forceinline__ void single_rank_token_dx(const comm::DeviceWorld& world, const ExchangeArgs& args,
                                                     WarpWorkers workers, int lane) {
  const int rank = world.first_local_rank;
  const BackwardBuffers& backward = args.backward;
  const int2* locations = world.at(args.schedule.buffers.route_location, rank);
  for_each_token_run(args.tokens, args.hidden / kBf16PerVector, workers, [&](int token, int first, int end) {
    const int64_t first_route = static_cast<int64_t>(token) * args.top_k;
    const int32_t* ids = world.at(args.schedule.buffers.topk_idx, rank) + first_route;
    if (first == 0) {  // the warp holding the token's first chunk
      float* dg = world.at(backward.dg_slots, rank) + first_route;
#pragma unroll 1  // as token_score_gradients's loops: no lane offsets kept for an unrolled loop
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
    reduce_token_slots<kInFlight>(
        [&](int slot) { return is_routed(__ldg(ids + slot), args.num_experts); }, args.top_k, row_of,
        args.has_shared ? row_vectors(world.at(backward.shared_dx, rank), token, args.hidden) + first : nullptr,
        row_vectors(world.at(backward.dx, rank), token, args.hidden) + first, end - first, lane);
  });
}

}  // namespace caracal::transfer::detail
