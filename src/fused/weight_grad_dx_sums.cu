// The fp32 weight-gradient kernel with the reverse dispatch's sums on its idle warps
// (weight_grad_dx_sums.cuh; the only kernel instantiated in this unit), and
// fused::weight_grads_with_dx_sums (src/fused/weight_grads_dx_sums.hpp), which launches it or the
// bf16 one (weight_grad_bf16_dx_sums.cu).
#include <array>

#include "caracal/error.hpp"
#include "fused/weight_grads_dx_sums.hpp"
#include "gemm/host_checks.hpp"
#include "gemm/launch.cuh"
#include "gemm/weight_grad_launch.hpp"
#include "transfer/exchange_internals.hpp"
#include "fused/weight_grad_dx_sums.cuh"

namespace caracal::fused {
namespace {

constexpr const char* kName = "weight_grads_with_dx_sums";

}  // namespace

void launch_weight_grad_dx_sums(const WeightGradDxSumsParams& p, int num_ctas, cudaStream_t stream) {
  gemm::launch_grouped_gemm<WeightGradDxSumsKernel>(p, num_ctas, stream, kName);
}

bool rides_dx_sums(const comm::World& world, transfer::DxSlots slots) {
  return world.world_size() == 1 && slots == transfer::DxSlots::kPerRoute;
}

void weight_grads_with_dx_sums(comm::World& world, transfer::TokenExchange& exchange,
                               const RouterNormalization& router, const gemm::ExpertPass& pass,
                               const gemm::ExpertPassGradients& grads, cudaStream_t stream) {
  CARACAL_CHECK(world.world_size() == 1, kName,
                ": needs a world of one rank (its sums read every token's rows on this GPU), got ", world.world_size(),
                " ranks");
  const gemm::WeightGradArgs args = gemm::weight_grad_args(pass, grads);
  gemm::check_weight_grads_args(args);
  const transfer::detail::ExchangeArgs sums = transfer::ExchangeInternals::filled_dx_slots_args(exchange, router,
                                                                                   transfer::DxSlots::kPerRoute);
  if (args.rows.row_capacity == 0) {  // no tiles to ride on
    gemm::grouped_weight_grads(args, stream);
    exchange.reverse_dispatch_filled_dx_slots(router, stream);
    return;
  }
  const std::array<gemm::WeightGradLaunch, 2> launches = gemm::weight_grad_launches(args);
  // dW_gate_up's, the longer launch, carries the sums.
  const gemm::WeightGradLaunch& gate_up = launches[0];
  WeightGradDxSumsParams p{};
  p.mainloop = gate_up.params.mainloop;
  p.scheduler = gate_up.params.scheduler;
  p.epilogue = gate_up.params.epilogue;
  p.idle_warps = {world.device_view(1, kName), sums};
  if (gate_up.bf16) {
    launch_weight_grad_bf16_dx_sums(p, gate_up.num_ctas, stream);
  } else {
    launch_weight_grad_dx_sums(p, gate_up.num_ctas, stream);
  }
  gemm::launch_weight_grad(launches[1], stream);
}

}  // namespace caracal::fused
