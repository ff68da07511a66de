#pragma once
// The standalone exchange kernels behind TokenExchange, one per .cu file beside it in src/transfer,
// each with its launch shape (fixed at setup) and its launcher, or for the pulls the kernel, which
// TokenExchange launches. CUDA code only (comm/launch.cuh).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "caracal/comm/cuda_check.hpp"
#include "caracal/comm/world.hpp"
#include "caracal/transfer/exchange_buffers.hpp"
#include "caracal/transfer/exchange_shape.hpp"
#include "comm/launch.cuh"
#include "device/transfer/device_params.hpp"
#include "device/transfer/exchange_args.hpp"
#include "device/transfer/row_copy.cuh"  // kWarpSize

namespace caracal::transfer::detail {

// The SMs all exchange launches of `world` may occupy (ExchangeOptions::max_sms, 0 = all but
// kExchangeFreeSms), at least one per local rank.
inline int exchange_sm_budget(const comm::World& world, int max_sms) {
  const int budget = max_sms > 0 ? std::min(max_sms, world.multiprocessors())
                                 : std::max(1, world.multiprocessors() - kExchangeFreeSms);
  return std::max(budget, world.local_ranks());
}

// Lets `kernel` take `bytes` of dynamic shared memory (above the default 48 KiB).
template <typename Kernel>
void allow_shared_bytes(Kernel kernel, size_t bytes, const char* what) {
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)), what);
}

// CTAs per rank giving each of `items_per_rank` work items its own worker (`per_cta` of them in a
// CTA), capped at what can be co-resident (`max_ctas`: world barriers need it) and at the SM
// budget shared by the local ranks (a CTA touches one SM), at least 1.
inline int ctas_for_items(const comm::World& world, int sm_budget, int max_ctas, int64_t items_per_rank,
                          int64_t per_cta) {
  const int64_t wanted = (items_per_rank + per_cta - 1) / per_cta;
  const int64_t budget = sm_budget / world.local_ranks();
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>({wanted, max_ctas, budget})));
}

// The shape of a pull (dispatch, reverse combine): a warp per row of the capacity, as many CTAs as
// can be co-resident.
template <typename Kernel>
comm::LaunchShape pull_launch_shape(comm::World& world, int sm_budget, const ExchangeSizes& sizes, Kernel kernel) {
  comm::LaunchShape shape;
  shape.threads_per_cta = kPullThreads;
  const int max_ctas = comm::max_ctas_per_rank(world, kernel, shape.threads_per_cta);
  shape.ctas_per_rank = ctas_for_items(world, sm_budget, max_ctas, sizes.row_capacity, kPullThreads / kWarpSize);
  return shape;
}

// The launches of a world of one rank (single_rank_pull.cuh, single_rank_combine.cuh) share the
// tokens' rows out in chunks of 32 vectors: their count, checked to fit in 32 bits.
int single_rank_chunks(const ExchangeShape& exchange);

// A launch of a world of one rank never waits on another CTA: it takes every SM, whatever the SM
// budget, with `threads` a CTA, as many CTAs as all `kernels` can keep co-resident and the chunks
// can use.
template <typename... Kernels>
comm::LaunchShape single_rank_launch_shape(comm::World& world, const ExchangeShape& exchange, int threads,
                                           size_t shared_bytes, Kernels... kernels) {
  comm::LaunchShape shape;
  shape.threads_per_cta = threads;
  shape.shared_bytes = shared_bytes;
  const int max_ctas = std::min({comm::max_ctas_per_rank(world, kernels, threads, shared_bytes)...});
  shape.ctas_per_rank =
      ctas_for_items(world, world.multiprocessors(), max_ctas, single_rank_chunks(exchange), threads / kWarpSize);
  return shape;
}

// The pulls and reverse dispatch in a world of one rank (single_rank_pull.cuh,
// reverse_dispatch_single_rank.cu: by token, every SM, no barrier).
bool runs_single_rank_pulls(const comm::World& world);

// A pull's kernel (dispatch, reverse combine: the expert side pulls rows from their home ranks),
// launched by TokenExchange with pull_launch_shape's shape (dispatch.cu, reverse_combine.cu) or, in
// a world of one rank, single_rank_launch_shape's (the _single_rank.cu files).
using PullKernel = void (*)(comm::DeviceWorld, ExchangeArgs);
PullKernel dispatch_pull_kernel();
PullKernel dispatch_single_rank_pull_kernel();
PullKernel dispatch_fp8_pull_kernel();  // dispatch_fp8.cu, dispatch_fp8_single_rank.cu
PullKernel dispatch_fp8_single_rank_pull_kernel();
PullKernel reverse_combine_pull_kernel();
PullKernel reverse_combine_single_rank_pull_kernel();
PullKernel reverse_combine_fp8_pull_kernel();  // reverse_combine_fp8.cu, reverse_combine_fp8_single_rank.cu
PullKernel reverse_combine_fp8_single_rank_pull_kernel();

comm::LaunchShape reverse_dispatch_single_rank_launch_shape(comm::World& world, const ExchangeShape& exchange);
// push_dx: the dx rows are read from expert_dx (else from the dx slots the dx GEMM filled).
void launch_reverse_dispatch_single_rank(comm::World& world, const comm::LaunchShape& shape, const ExchangeArgs& args,
                                         cudaStream_t stream, bool push_dx);

comm::LaunchShape schedule_launch_shape(comm::World& world, int sm_budget, const ExchangeSizes& sizes);
void launch_schedule(comm::World& world, const comm::LaunchShape& shape, const ExchangeArgs& args, cudaStream_t stream);

comm::LaunchShape combine_launch_shape(comm::World& world, int sm_budget, const ExchangeShape& exchange,
                                       const ExchangeSizes& sizes);
// args.combine names what is pushed.
void launch_combine(comm::World& world, const comm::LaunchShape& shape, const ExchangeArgs& args, cudaStream_t stream);

// Whether combine runs in one pass (combine_single_rank.cu): a world of one rank, and the shared
// row and a token's k routes fit a staged sum's lanes.
bool runs_single_rank_combine(const comm::World& world, const ExchangeShape& exchange);
comm::LaunchShape combine_single_rank_launch_shape(comm::World& world, const ExchangeShape& exchange);
void launch_combine_single_rank(comm::World& world, const comm::LaunchShape& shape, const ExchangeArgs& args,
                                cudaStream_t stream);

comm::LaunchShape reverse_dispatch_launch_shape(comm::World& world, int sm_budget, const ExchangeShape& exchange,
                                                const ExchangeSizes& sizes);
// push_dx false: the dx rows are in the home slots already (only dg is pushed).
void launch_reverse_dispatch(comm::World& world, const comm::LaunchShape& shape, const ExchangeArgs& args,
                             cudaStream_t stream, bool push_dx);

}  // namespace caracal::transfer::detail
