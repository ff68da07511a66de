// reverse_combine when the world has one rank (single_rank_pull.cuh): the dy rows and their g by
// token, on every SM, without a barrier; the same rows as reverse_combine.cu's.
#include "device/transfer/single_rank_pull.cuh"
#include "transfer/exchange_launch.hpp"

namespace caracal::transfer::detail {
namespace {

__global__ void __launch_bounds__(kPullThreads, 1) reverse_combine_single_rank_kernel(comm::DeviceWorld world,
                                                                                       ExchangeArgs args) {
  pull_rows_single_rank<true, kCoherentPulls>(world, args.schedule, args.window,
                                         PullRows{args.backward.dy, args.backward.expert_dy, args.router.gates,
                                                  args.backward.expert_gates, args.top_k, args.hidden},
                                         args.tokens);
}

}  // namespace

comm::LaunchShape reverse_combine_single_rank_launch_shape(comm::World& world, const ExchangeShape& exchange) {
  return single_rank_launch_shape(world, exchange, kPullThreads, 0, reverse_combine_single_rank_kernel);
}

void launch_reverse_combine_single_rank(comm::World& world, const comm::LaunchShape& shape, const ExchangeArgs& args,
                                        cudaStream_t stream) {
  comm::launch(world, "TokenExchange::reverse_combine", shape, stream, reverse_combine_single_rank_kernel, args);
}

}  // namespace caracal::transfer::detail
