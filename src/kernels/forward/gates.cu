// compute_gates: g from topk_scores on every local rank, one thread per token. Local work only,
// launched on the world like the other exchange kernels so that all loopback ranks share one launch.
#include "device/transfer/router_math.cuh"
#include "transfer/exchange_launch.hpp"

namespace caracal::transfer::detail {
namespace {

// A light kernel, one thread per token.

__global__ void __launch_bounds__(kGatesThreads, 1)
    gates_kernel(comm::DeviceWorld world, ExchangeArgs args) {
  const int64_t total = static_cast<int64_t>(world.local_ranks) * args.tokens;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int rank = world.first_local_rank + static_cast<int>(i / args.tokens);
    const int64_t first_route = (i % args.tokens) * args.top_k;
    token_gates(world.at(args.schedule.buffers.topk_idx, rank) + first_route,
                world.at(args.router.topk_scores, rank) + first_route, args.num_experts, args.top_k, args.scaling,
                world.at(args.router.gates, rank) + first_route);
  }
}

}  // namespace

comm::LaunchShape gates_launch_shape(comm::World& world, int sm_budget, const ExchangeShape& exchange) {
  comm::LaunchShape shape;
  shape.threads_per_cta = kGatesThreads;
  const int max_ctas = comm::max_ctas_per_rank(world, gates_kernel, shape.threads_per_cta);
  shape.ctas_per_rank = ctas_for_items(world, sm_budget, max_ctas, exchange.tokens, kGatesThreads);  // a thread per token
  return shape;
}

void launch_gates(comm::World& world, const comm::LaunchShape& shape, const ExchangeArgs& args, cudaStream_t stream) {
  comm::launch(world, "TokenExchange::compute_gates", shape, stream, gates_kernel, args);
}

}  // namespace caracal::transfer::detail
