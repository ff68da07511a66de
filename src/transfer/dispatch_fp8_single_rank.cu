// dispatch_fp8 when the world has one rank (pull_fp8_rows.cuh): the e4m3 x rows by token, on every
// SM, without a barrier; the same rows as dispatch_fp8.cu's.
#include "device/transfer/pull_fp8_rows.cuh"
#include "transfer/exchange_launch.hpp"

namespace caracal::transfer::detail {
namespace {

__global__ void __launch_bounds__(kPullThreads, 1) dispatch_fp8_single_rank_kernel(comm::DeviceWorld world,
                                                                                    ExchangeArgs args) {
  pull_fp8_rows_single_rank<false>(world, args.schedule, fp8_pull_rows(args), args.tokens);
}

}  // namespace

PullKernel dispatch_fp8_single_rank_pull_kernel() { return dispatch_fp8_single_rank_kernel; }

}  // namespace caracal::transfer::detail
