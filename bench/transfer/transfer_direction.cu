#include "transfer_direction.hpp"

#include "caracal/comm/cuda_check.hpp"
#include "device_random.cuh"
#include "event_timer.hpp"
#include "transfer_case.hpp"

namespace caracal::bench {
namespace {

// Random inputs of `ex`'s local ranks; topk_idx from the routing.
void fill_inputs(transfer::TokenExchange& ex, const Routing& routing, uint64_t seed, cudaStream_t stream) {
  const comm::World& world = ex.world();
  const size_t routes = static_cast<size_t>(ex.sizes().routes);
  const size_t token_values = static_cast<size_t>(ex.shape().tokens * ex.shape().hidden);
  const size_t row_capacity = static_cast<size_t>(ex.sizes().row_capacity);
  const size_t expert_values = row_capacity * static_cast<size_t>(ex.shape().hidden);
  for (int l = 0; l < world.local_ranks(); ++l) {
    const int r = world.first_local_rank() + l;
    const uint64_t s = seed + 16 * static_cast<uint64_t>(r);
    check_cuda(cudaMemcpyAsync(world.local_pointer(ex.schedule_buffers().topk_idx, l), routing.rank_topk(r),
                               routes * sizeof(int32_t), cudaMemcpyHostToDevice, stream),
               "cudaMemcpyAsync(topk_idx)");
    fill_uniform(world.local_pointer(ex.router_buffers().topk_scores, l), routes, s + 1, 0.05f, 1.0f, stream);
    if (ex.options().forward) {
      fill_uniform(world.local_pointer(ex.forward_buffers().x, l), token_values, s + 2, -2.0f, 2.0f, stream);
      fill_uniform(world.local_pointer(ex.forward_buffers().expert_out, l), expert_values, s + 3, -2.0f, 2.0f, stream);
    }
    if (ex.options().backward) {
      fill_uniform(world.local_pointer(ex.backward_buffers().dy, l), token_values, s + 4, -2.0f, 2.0f, stream);
      fill_uniform(world.local_pointer(ex.backward_buffers().expert_dx, l), expert_values, s + 5, -2.0f, 2.0f, stream);
      fill_uniform(world.local_pointer(ex.backward_buffers().expert_dg, l), row_capacity, s + 6, -1.0f, 1.0f, stream);
    }
  }
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize(inputs)");  // the topk_idx copies are pageable
}

void sync(cudaStream_t stream) { check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize"); }

}  // namespace

std::array<Pass, 2> passes_of(bool forward) {
  if (forward) return {Pass::kDispatch, Pass::kCombine};
  return {Pass::kReverseCombine, Pass::kReverseDispatch};
}

double OneThreadRanks::median_ms(cudaStream_t stream, const std::function<void()>& run) {
  return bench::median_ms(stream, warmup_, reps_, run);
}

void OneThreadRanks::check(const transfer::TokenExchange& ex, const Check& check) { require(check(ExchangeRanks(ex))); }

void run_exchange(transfer::TokenExchange& ex, const ModelPreset& model, const Routing& routing,
                  const std::vector<int64_t>& rows_per_rank, uint64_t seed, RankGroup& group, cudaStream_t stream,
                  ExchangeTimes& times) {
  fill_inputs(ex, routing, seed, stream);
  const auto check_rows = [&] {
    sync(stream);
    ex.check();
    group.check(ex, [&](const ExchangeRanks& ranks) { return check_total_rows(ranks, rows_per_rank); });
  };
  ex.build_schedule(model.router, stream);
  check_rows();
  times.schedule_ms = group.median_ms(stream, [&] { ex.build_schedule(model.router, stream); });
  check_rows();

  for (const Pass pass : passes_of(ex.options().forward)) {
    const auto run = [&] {
      switch (pass) {
        case Pass::kDispatch:
          ex.dispatch(stream);
          break;
        case Pass::kCombine:
          ex.combine(model.router, stream);
          break;
        case Pass::kReverseCombine:
          ex.reverse_combine(stream);
          break;
        case Pass::kReverseDispatch:
          ex.reverse_dispatch(model.router, stream);
          break;
      }
    };
    const auto check = [&](uint64_t s) {
      sync(stream);
      ex.check();
      group.check(ex, [&](const ExchangeRanks& ranks) {
        return is_pull(pass) ? check_pull(ranks, routing, pass == Pass::kReverseCombine, s)
                             : check_slot_sum(ranks, routing, pass == Pass::kReverseDispatch, s);
      });
    };
    run();
    check(seed);
    const double ms = group.median_ms(stream, run);
    check(seed + 1);
    times.pass_ms.push_back(ms);
  }
}

}  // namespace caracal::bench
