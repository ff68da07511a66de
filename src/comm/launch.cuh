#pragma once
// Launching backend-agnostic kernels: `__global__ void k(DeviceWorld world, Params...)`, grid =
// local_ranks × ctas_per_rank CTAs on one stream.
//
// Co-residency: world_barrier needs every CTA of the launch resident at once (a CTA that waits
// for a CTA that was never scheduled would only end by timing out). launch() therefore launches
// cooperatively (cudaLaunchAttributeCooperative), for which CUDA guarantees co-residency and
// refuses a grid that cannot fit; that refusal is turned into a caracal::Error giving the limit.
// Cooperative launches are captured into CUDA graphs like any other (CUDA >= 12) and replayed
// with the same guarantee, so launch() is graph-capturable: it only reads host state and enqueues.
//
// A kernel that starts early (LaunchShape::starts_early, grid_dependency.cuh) is launched without
// the cooperative attribute: with it CUDA starts the grid only once the kernel before it has
// completed, PDL or not (a cooperative secondary starts after its primary ended, a plain one while
// it runs). Such a kernel gets every CTA resident only
// eventually (as the earlier kernel's CTAs exit), so it must not use world barriers, and launch()
// refuses a grid larger than the device can hold at once.
#include <utility>

#include <cuda_runtime.h>

#include "caracal/comm/cuda_check.hpp"
#include "caracal/comm/world.hpp"
#include "device/comm/device_world.cuh"

namespace caracal::comm {

struct LaunchShape {
  int ctas_per_rank = 1;
  int threads_per_cta = 256;
  size_t shared_bytes = 0;  // dynamic shared memory per CTA
  // Programmatic dependent launch (grid_dependency.cuh): the kernel may start while the kernel
  // before it on the stream still runs, once that one allowed it; it waits for that kernel's
  // output itself. Not cooperative (see above): no world barriers in such a kernel.
  bool starts_early = false;
};

namespace detail {
[[noreturn]] void throw_not_coresident(const World& world, const char* name, const LaunchShape& shape,
                                       int ctas_per_sm);
}  // namespace detail

// The largest ctas_per_rank whose grid can be co-resident for `kernel` on world's device.
template <typename... Params>
int max_ctas_per_rank(const World& world, void (*kernel)(DeviceWorld, Params...), int threads_per_cta,
                      size_t shared_bytes = 0) {
  int per_sm = 0;
  check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads_per_cta, shared_bytes),
             "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  return per_sm * world.multiprocessors() / world.local_ranks();
}

// Launches `kernel(world.device_view(...), args...)` on `stream`, cooperatively unless it starts
// early. `name` names the launch in device-error messages. Throws caracal::Error if the launch
// fails or the grid cannot be resident at once.
template <typename... Params, typename... Args>
void launch(World& world, const char* name, const LaunchShape& shape, cudaStream_t stream,
            void (*kernel)(DeviceWorld, Params...), Args&&... args) {
  const auto check_coresident = [&] {
    int per_sm = 0;
    check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, shape.threads_per_cta, shape.shared_bytes),
               "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
    if (static_cast<long long>(world.local_ranks()) * shape.ctas_per_rank >
        static_cast<long long>(per_sm) * world.multiprocessors()) {
      detail::throw_not_coresident(world, name, shape, per_sm);
    }
  };
  if (shape.starts_early) check_coresident();  // CUDA does not check it for a plain launch
  const DeviceWorld view = world.device_view(shape.ctas_per_rank, name);
  cudaLaunchAttribute attr{};
  if (shape.starts_early) {
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
  } else {
    attr.id = cudaLaunchAttributeCooperative;
    attr.val.cooperative = 1;
  }
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(world.local_ranks() * shape.ctas_per_rank));
  config.blockDim = dim3(static_cast<unsigned>(shape.threads_per_cta));
  config.dynamicSmemBytes = shape.shared_bytes;
  config.stream = stream;
  config.attrs = &attr;
  config.numAttrs = 1;
  const cudaError_t err = cudaLaunchKernelEx(&config, kernel, view, std::forward<Args>(args)...);
  if (err == cudaSuccess) return;
  (void)cudaGetLastError();  // launch errors are not sticky: clear it so later calls do not see it
  check_coresident();  // the usual cause (cudaErrorCooperativeLaunchTooLarge) deserves a message with the limit
  check_cuda(err, name);
}

}  // namespace caracal::comm
