// reverse_dispatch when the world has one rank: each token's dx and d topk_scores in one pass
// (single_rank_dx_sums.cuh) on every warp of every SM: it never waits on another CTA.
#include "device/transfer/single_rank_dx_sums.cuh"
#include "transfer/exchange_launch.hpp"

namespace caracal::transfer::detail {
namespace {

template <bool kFromExpertRows>
__global__ void __launch_bounds__(kReduceThreads, 1)
    reverse_dispatch_single_rank_kernel(comm::DeviceWorld world, ExchangeArgs args) {
  single_rank_token_dx<kFromExpertRows>(world, args, launch_warps(), static_cast<int>(threadIdx.x) % kWarpSize);
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
