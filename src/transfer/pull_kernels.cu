// dispatch and reverse_combine: the expert side pulls token rows from their home ranks.
#include "caracal/comm/device_sync.cuh"
#include "caracal/transfer/token_rows.cuh"
#include "caracal/transfer/warp_work.cuh"
#include "exchange_kernels.hpp"

namespace caracal::transfer::detail {
namespace {

// One CTA of 32 warps per SM (64 registers), each warp with kCopyUnroll vectors per lane in flight.
// Below 64 registers ptxas spills around the row loop.

// kReverseCombine: dy rows into expert_dy, with g beside them in expert_gates; otherwise x rows
// into expert_x. kCoherent: ld.global (the default), else ld.global.nc (ExchangeOptions::
// noncoherent_pull_loads).
template <bool kReverseCombine, bool kCoherent>
__global__ void __launch_bounds__(kPullThreads, 1)
    pull_rows_kernel(comm::DeviceWorld world, ExchangeArgs args) {
  const comm::CtaPlace place = comm::whole_launch_place(world);
  // The home rows (and gates) of every rank are in place, and no rank is still in an earlier
  // launch that reads what this one overwrites.
  if (!comm::world_barrier(world, place)) return;
  const comm::SymmetricPtr<__nv_bfloat16> home_rows = kReverseCombine ? args.backward.dy : args.forward.x;
  const comm::SymmetricPtr<__nv_bfloat16> expert_rows =
      kReverseCombine ? args.backward.expert_dy : args.forward.expert_x;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  for_each_local_row(world, args.schedule.buffers.total_rows, role_warps(world, place), [&](int rank, int row) {
    const int2 entry = world.at(args.schedule.buffers.rows, rank)[row];
    if constexpr (kReverseCombine) {
      // g travels beside dy, not applied to it: the router-score gradient needs <dy, E(x)> before
      // g (DESIGN §3). Padding rows get g = 0.
      if (lane == 0) {
        world.at(args.backward.expert_gates, rank)[row] =
            entry.x < 0 ? 0.0f : world.at(args.router.gates, entry.x)[entry.y];
      }
    }
    pull_token_row<kCoherent>(world, entry, home_rows, args.top_k, args.hidden,
                   row_vectors(world.at(expert_rows, rank), row, args.hidden), lane);
  });
}

}  // namespace

comm::LaunchShape pull_launch_shape(comm::World& world, int sm_budget, const ExchangeSizes& sizes) {
  comm::LaunchShape shape;
  shape.threads_per_cta = kPullThreads;
  const int max_ctas = std::min({comm::max_ctas_per_rank(world, pull_rows_kernel<false, false>, shape.threads_per_cta),
                                 comm::max_ctas_per_rank(world, pull_rows_kernel<true, false>, shape.threads_per_cta),
                                 comm::max_ctas_per_rank(world, pull_rows_kernel<false, true>, shape.threads_per_cta),
                                 comm::max_ctas_per_rank(world, pull_rows_kernel<true, true>, shape.threads_per_cta)});
  shape.ctas_per_rank = ctas_for_items(world, sm_budget, max_ctas, sizes.row_capacity, kPullThreads / kWarpSize);  // a warp per row
  return shape;
}

void launch_dispatch(comm::World& world, const comm::LaunchShape& shape, const ExchangeArgs& args,
                     cudaStream_t stream) {
  comm::launch(world, "TokenExchange::dispatch", shape, stream,
               args.noncoherent_pull_loads ? pull_rows_kernel<false, false> : pull_rows_kernel<false, true>, args);
}

void launch_reverse_combine(comm::World& world, const comm::LaunchShape& shape, const ExchangeArgs& args,
                            cudaStream_t stream) {
  comm::launch(world, "TokenExchange::reverse_combine", shape, stream,
               args.noncoherent_pull_loads ? pull_rows_kernel<true, false> : pull_rows_kernel<true, true>, args);
}

}  // namespace caracal::transfer::detail
