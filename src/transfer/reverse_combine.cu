// reverse_combine: the expert side pulls the dy rows of its schedule from their home ranks, with
// each route's g beside them.
#include "device/comm/device_sync.cuh"
#include "device/transfer/pull_rows.cuh"
#include "transfer/exchange_launch.hpp"

namespace caracal::transfer::detail {
namespace {

// The shape of dispatch_kernel (dispatch.cu): one CTA of 32 warps per SM, 64 registers.
__global__ void __launch_bounds__(kPullThreads, 1) reverse_combine_kernel(comm::DeviceWorld world, ExchangeArgs args) {
  const comm::CtaPlace place = comm::whole_launch_place(world);
  // The home dy rows and gates of every rank are in place, and no rank is still in an earlier
  // launch that reads what this one overwrites (unless an earlier launch of the pass saw to both:
  // PullRange::after_barrier).
  if (args.window.barrier && !comm::world_barrier(world, place)) return;
  pull_schedule_rows<true, kCoherentPulls>(
      world, args.schedule, args.window, role_warps(world, place),
      PullRows{args.backward.dy, args.backward.expert_dy, args.router.gates, args.backward.expert_gates, args.top_k,
               args.hidden},
      args.rows_per_route);
}

}  // namespace

PullKernel reverse_combine_pull_kernel() { return reverse_combine_kernel; }

}  // namespace caracal::transfer::detail
