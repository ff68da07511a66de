// dispatch and reverse_combine: the expert side pulls token rows from their home ranks.
#include "caracal/comm/device_sync.cuh"
#include "caracal/transfer/token_rows.cuh"
#include "caracal/transfer/warp_work.cuh"
#include "exchange_kernels.hpp"

namespace caracal::transfer::detail {
namespace {

// 4 CTAs per SM (64 registers): 32 warps, each with kCopyUnroll vectors per lane in flight. Without a
// bound, ptxas squeezes to 48 registers and spills around the row loop.
constexpr int kMinCtasPerSm = 4;

// kReverseCombine: dy rows into expert_dy, with g beside them in expert_gates; otherwise x rows
// into expert_x.
template <bool kReverseCombine>
__global__ void __launch_bounds__(kExchangeThreads, kMinCtasPerSm)
    pull_rows_kernel(comm::DeviceWorld world, ExchangeArgs args) {
  // The home rows (and gates) of every rank are in place, and no rank is still in an earlier
  // launch that reads what this one overwrites.
  if (!comm::world_barrier(world)) return;
  const comm::SymmetricPtr<__nv_bfloat16> home_rows = kReverseCombine ? args.backward.dy : args.forward.x;
  const comm::SymmetricPtr<__nv_bfloat16> expert_rows =
      kReverseCombine ? args.backward.expert_dy : args.forward.expert_x;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  for_each_local_row(world, args.schedule.buffers.total_rows, launch_warps(), [&](int rank, int row) {
    const int2 entry = world.at(args.schedule.buffers.rows, rank)[row];
    if constexpr (kReverseCombine) {
      // g travels beside dy, not applied to it: the router-score gradient needs <dy, E(x)> before
      // g (DESIGN §3). Padding rows get g = 0.
      if (lane == 0) {
        world.at(args.backward.expert_gates, rank)[row] =
            entry.x < 0 ? 0.0f : world.at(args.router.gates, entry.x)[entry.y];
      }
    }
    pull_token_row(world, entry, home_rows, args.top_k, args.hidden,
                   row_vectors(world.at(expert_rows, rank), row, args.hidden), lane);
  });
}

}  // namespace

comm::LaunchShape pull_launch_shape(comm::World& world, const ExchangeSizes& sizes) {
  comm::LaunchShape shape;
  shape.threads_per_cta = kExchangeThreads;
  const int max_ctas = std::min(comm::max_ctas_per_rank(world, pull_rows_kernel<false>, shape.threads_per_cta),
                                comm::max_ctas_per_rank(world, pull_rows_kernel<true>, shape.threads_per_cta));
  shape.ctas_per_rank = ctas_for_items(max_ctas, sizes.row_capacity, kExchangeThreads / kWarpSize);  // a warp per row
  return shape;
}

void launch_dispatch(comm::World& world, const comm::LaunchShape& shape, const ExchangeArgs& args,
                     cudaStream_t stream) {
  comm::launch(world, "TokenExchange::dispatch", shape, stream, pull_rows_kernel<false>, args);
}

void launch_reverse_combine(comm::World& world, const comm::LaunchShape& shape, const ExchangeArgs& args,
                            cudaStream_t stream) {
  comm::launch(world, "TokenExchange::reverse_combine", shape, stream, pull_rows_kernel<true>, args);
}

}  // namespace caracal::transfer::detail
