// combine when the world has one rank (single_rank_combine.cuh): each token's y in one pass, the
// same bits as combine's two passes (combine.cu) without their slot rows and barrier. The work is
// the tokens' rows cut into chunks of 32 vectors (512 bytes), every warp taking an equal run of
// consecutive chunks: the two-pass kernel hands out schedule rows, of which only the group leaders
// (one in k at W = 1) carry work, and its warps that drew few leaders idled at its barrier (ncu,
// DeepSeek-V3 W = 1: "barrier" the top stall, the busiest SM 20% above the mean). It never waits
// on another CTA, so it takes every SM.
#include <climits>

#include "device/transfer/single_rank_combine.cuh"
#include "device/transfer/warp_work.cuh"
#include "transfer/exchange_launch.hpp"

namespace caracal::transfer::detail {
namespace {

__global__ void __launch_bounds__(kReduceThreads, 1) combine_single_rank_kernel(comm::DeviceWorld world,
                                                                                ExchangeArgs args) {
  const int rank = world.first_local_rank;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  extern __shared__ uint4 combine_stages[];
  uint4* const stage = warp_stage(combine_stages);
  const ScheduleBuffers& schedule = args.schedule.buffers;
  const CombinePush& push = args.combine;
  const int vectors = args.hidden / kBf16PerVector;
  __nv_bfloat16* const y_out = push.y_out[0] != nullptr ? push.y_out[0] : world.at(args.forward.y, rank);
  // tokens x chunks fits in 32 bits: combine_single_rank_launch_shape checks.
  for_each_token_run(args.tokens, vectors, [&](int token, int first_vector, int end_vector) {
    const int64_t first_route = static_cast<int64_t>(token) * args.top_k;
    TokenSumInputs in;
    in.ids = world.at(schedule.topk_idx, rank) + first_route;
    in.scores = world.at(args.router.topk_scores, rank) + first_route;
    in.locations = world.at(schedule.route_location, rank) + first_route;
    in.rows = row_vectors(world.at(push.rows, rank), 0, args.hidden);
    in.slots = row_vectors(world.at(args.forward.combine_slots, rank), first_route, args.hidden);
    in.shared = args.has_shared ? row_vectors(world.at(args.forward.shared_out, rank), token, args.hidden) : nullptr;
    in.num_experts = args.num_experts;
    in.top_k = args.top_k;
    in.group_rows = push.group_rows;
    in.end_row = push.end_row > 0 ? push.end_row : INT_MAX;
    in.per_route = args.rows_per_route;
    in.vectors = vectors;
    in.scaling = args.scaling;
    warp_single_rank_combine(in, first_vector, end_vector - first_vector, row_vectors(y_out, token, args.hidden),
                             stage, lane);
  });
}

}  // namespace

bool runs_single_rank_combine(const comm::World& world, const ExchangeShape& exchange) {
  return runs_single_rank_pulls(world) && exchange.top_k < kMaxStagedRows;
}

comm::LaunchShape combine_single_rank_launch_shape(comm::World& world, const ExchangeShape& exchange) {
  const size_t shared_bytes = staged_sum_shared_bytes(kReduceThreads);
  allow_shared_bytes(combine_single_rank_kernel, shared_bytes,
                     "cudaFuncSetAttribute(combine_single_rank_kernel, MaxDynamicSharedMemorySize)");
  return single_rank_launch_shape(world, exchange, kReduceThreads, shared_bytes, combine_single_rank_kernel);
}

void launch_combine_single_rank(comm::World& world, const comm::LaunchShape& shape, const ExchangeArgs& args,
                                cudaStream_t stream) {
  comm::launch(world, "TokenExchange::combine", shape, stream, combine_single_rank_kernel, args);
}

}  // namespace caracal::transfer::detail
