// dispatch when the world has one rank (single_rank_pull.cuh): the x rows by token, on every SM,
// without a barrier; the same rows as dispatch.cu's.
#include "device/transfer/single_rank_pull.cuh"
#include "transfer/exchange_launch.hpp"

namespace caracal::transfer::detail {
namespace {

template <bool kCoherent>
__global__ void __launch_bounds__(kPullThreads, 1) dispatch_single_rank_kernel(comm::DeviceWorld world,
                                                                                ExchangeArgs args) {
  pull_rows_single_rank<false, kCoherent>(
      world, args.schedule, args.window,
      PullRows{args.forward.x, args.forward.expert_x, {}, {}, args.top_k, args.hidden}, args.tokens);
}

}  // namespace

comm::LaunchShape dispatch_single_rank_launch_shape(comm::World& world, const ExchangeShape& exchange) {
  return single_rank_launch_shape(world, exchange, kPullThreads, 0, dispatch_single_rank_kernel<true>,
                                       dispatch_single_rank_kernel<false>);
}

void launch_dispatch_single_rank(comm::World& world, const comm::LaunchShape& shape, const ExchangeArgs& args,
                                 cudaStream_t stream) {
  comm::launch(world, "TokenExchange::dispatch", shape, stream,
               args.noncoherent_pull_loads ? dispatch_single_rank_kernel<false> : dispatch_single_rank_kernel<true>,
               args);
}

}  // namespace caracal::transfer::detail
