// dispatch when the world has one rank (single_rank_pull.cuh): the x rows by token, on every SM,
// without a barrier; the same rows as dispatch.cu's.
#include "device/transfer/single_rank_pull.cuh"
#include "transfer/exchange_launch.hpp"

namespace caracal::transfer::detail {
namespace {

__global__ void __launch_bounds__(kPullThreads, 1) dispatch_single_rank_kernel(comm::DeviceWorld world,
                                                                                ExchangeArgs args) {
  pull_rows_single_rank<false, kCoherentPulls>(
      world, args.schedule, args.window,
      PullRows{args.forward.x, args.forward.expert_x, {}, {}, args.top_k, args.hidden}, args.tokens);
}

}  // namespace

PullKernel dispatch_single_rank_pull_kernel() { return dispatch_single_rank_kernel; }

}  // namespace caracal::transfer::detail
