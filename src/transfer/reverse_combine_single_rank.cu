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

PullKernel reverse_combine_single_rank_pull_kernel() { return reverse_combine_single_rank_kernel; }

}  // namespace caracal::transfer::detail
