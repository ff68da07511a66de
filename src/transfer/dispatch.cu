// dispatch: the expert side pulls the x rows of its schedule from their home ranks.
#include "device/comm/device_sync.cuh"
#include "device/transfer/pull_rows.cuh"
#include "transfer/exchange_launch.hpp"

namespace caracal::transfer::detail {
namespace {

// One CTA of 32 warps per SM (64 registers), each warp with kCopyUnroll vectors per lane in flight.
// Below 64 registers ptxas spills around the row loop.
__global__ void __launch_bounds__(kPullThreads, 1) dispatch_kernel(comm::DeviceWorld world, ExchangeArgs args) {
  const comm::CtaPlace place = comm::whole_launch_place(world);
  // The home rows of every rank are in place, and no rank is still in an earlier launch that
  // reads what this one overwrites (unless an earlier launch of the pass saw to both:
  // PullRange::after_barrier).
  if (args.window.barrier && !comm::world_barrier(world, place)) return;
  pull_schedule_rows<false, kCoherentPulls>(world, args.schedule, args.window, role_warps(world, place),
                                       PullRows{args.forward.x, args.forward.expert_x, {}, {}, args.top_k, args.hidden},
                                       args.rows_per_route);
}

}  // namespace

PullKernel dispatch_pull_kernel() { return dispatch_kernel; }

}  // namespace caracal::transfer::detail
