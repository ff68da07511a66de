// The schedule builder as a standalone launch: every CTA runs schedule::build_schedule for its rank,
// and computes g of its rank's tokens (token_gates, one thread per token) after the builder's entry
// barrier, so that the schedule and the gates take one launch. It lets the launch after it start at
// once (the fused forward's shared-expert tiles need no schedule: fused_forward.hpp).
#include "caracal/comm/cuda_check.hpp"
#include "device/comm/grid_dependency.cuh"
#include "device/transfer/router_math.cuh"
#include "device/transfer/schedule_build.cuh"
#include "transfer/exchange_launch.hpp"

namespace caracal::transfer::detail {
namespace {

__global__ void __launch_bounds__(kScheduleThreads, 1)
    build_schedule_kernel(comm::DeviceWorld world, ExchangeArgs args) {
  extern __shared__ int shared[];
  comm::allow_dependent_launch();
  const comm::CtaPlace place = comm::whole_launch_place(world);
  const auto gates = [&](int thread, int threads) {
    for (int t = thread; t < args.tokens; t += threads) {
      const int64_t first_route = static_cast<int64_t>(t) * args.top_k;
      token_gates(world.at(args.schedule.buffers.topk_idx, place.rank) + first_route,
                  world.at(args.router.topk_scores, place.rank) + first_route, args.num_experts, args.top_k,
                  args.scaling, world.at(args.router.gates, place.rank) + first_route);
    }
  };
  // A timeout is recorded; nothing is left to do.
  (void)schedule::build_schedule(world, place, args.schedule, shared, gates);
}

}  // namespace

comm::LaunchShape schedule_launch_shape(comm::World& world, int sm_budget, const ExchangeSizes& sizes) {
  comm::LaunchShape shape;
  shape.threads_per_cta = kScheduleThreads;
  shape.shared_bytes = sizes.schedule_shared_bytes;
  // The limit belongs to the kernel, shared by every exchange of the process on this device: set
  // it to the most any shape may ask for (exchange_sizes caps them there), never to this one's,
  // or a later exchange with a smaller shape would make this one's launches invalid.
  allow_shared_bytes(build_schedule_kernel, kMaxSharedBytesPerCta,
                     "cudaFuncSetAttribute(build_schedule_kernel, MaxDynamicSharedMemorySize)");
  const int max_ctas = comm::max_ctas_per_rank(world, build_schedule_kernel, shape.threads_per_cta, shape.shared_bytes);
  shape.ctas_per_rank = ctas_for_items(world, sm_budget, max_ctas, sizes.world_size * sizes.blocks, 1);  // a CTA per block
  return shape;
}

void launch_schedule(comm::World& world, const comm::LaunchShape& shape, const ExchangeArgs& args,
                     cudaStream_t stream) {
  comm::launch(world, "TokenExchange::build_schedule", shape, stream, build_schedule_kernel, args);
}

}  // namespace caracal::transfer::detail
