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

comm::LaunchShape dispatch_launch_shape(comm::World& world, int sm_budget, const ExchangeSizes& sizes) {
  return pull_launch_shape(world, sm_budget, sizes, dispatch_kernel);
}

void launch_dispatch(comm::World& world, const comm::LaunchShape& shape, const ExchangeArgs& args,
                     cudaStream_t stream) {
  comm::launch(world, "TokenExchange::dispatch", shape, stream, dispatch_kernel, args);
}

}  // namespace caracal::transfer::detail
