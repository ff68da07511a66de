// The schedule builder as a standalone launch: every CTA runs schedule::build_schedule for its rank.
#include "caracal/comm/cuda_check.hpp"
#include "device/transfer/schedule_build.cuh"
#include "transfer/exchange_launch.hpp"

namespace caracal::transfer::detail {
namespace {

// 16 warps per SM: the fully unrolled chunk steps keep 32 route ids per lane in registers.

__global__ void __launch_bounds__(kScheduleThreads, 1)
    build_schedule_kernel(comm::DeviceWorld world, ExchangeArgs args) {
  extern __shared__ int shared[];
  // A timeout is recorded; nothing is left to do.
  (void)schedule::build_schedule(world, comm::whole_launch_place(world), args.schedule, shared);
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
  shape.ctas_per_rank =
      ctas_for_items(world, sm_budget, max_ctas, sizes.world_size * sizes.chunks, kScheduleThreads / kWarpSize);  // a warp per chunk
  return shape;
}

void launch_schedule(comm::World& world, const comm::LaunchShape& shape, const ExchangeArgs& args,
                     cudaStream_t stream) {
  comm::launch(world, "TokenExchange::build_schedule", shape, stream, build_schedule_kernel, args);
}

}  // namespace caracal::transfer::detail
