// reverse_combine_fp8 when the world has one rank (pull_fp8_rows.cuh): the e4m3 dy rows and their g
// by token, on every SM, without a barrier; the same rows as reverse_combine_fp8.cu's.
#include "device/transfer/pull_fp8_rows.cuh"
#include "transfer/exchange_launch.hpp"

namespace caracal::transfer::detail {
namespace {

__global__ void __launch_bounds__(kPullThreads, 1) reverse_combine_fp8_single_rank_kernel(comm::DeviceWorld world,
                                                                                          ExchangeArgs args) {
  pull_fp8_rows_single_rank<true>(world, args.schedule, fp8_dy_pull_rows(args), args.tokens);
}

}  // namespace

PullKernel reverse_combine_fp8_single_rank_pull_kernel() { return reverse_combine_fp8_single_rank_kernel; }

}  // namespace caracal::transfer::detail
