// dispatch_fp8: the expert side pulls the e4m3 x rows of its schedule and their scales from their
// home ranks (pull_fp8_rows.cuh).
#include "device/comm/device_sync.cuh"
#include "device/transfer/pull_fp8_rows.cuh"
#include "transfer/exchange_launch.hpp"

namespace caracal::transfer::detail {
namespace {

// The bf16 dispatch's shape (dispatch.cu): one CTA of 32 warps per SM.
__global__ void __launch_bounds__(kPullThreads, 1) dispatch_fp8_kernel(comm::DeviceWorld world, ExchangeArgs args) {
  const comm::CtaPlace place = comm::whole_launch_place(world);
  // Every rank's x_codes and x_scales are in place, and no rank is still in an earlier launch that
  // reads what this one overwrites.
  if (!comm::world_barrier(world, place)) return;
  pull_fp8_schedule_rows<false>(world, args.schedule, args.window, role_warps(world, place), fp8_pull_rows(args),
                         args.rows_per_route);
}

}  // namespace

PullKernel dispatch_fp8_pull_kernel() { return dispatch_fp8_kernel; }

}  // namespace caracal::transfer::detail
