#pragma once
// The routed experts' weight gradients with reverse dispatch riding on them, in a world of one rank:
// gemm::expert_weight_grads's two launches, dW_gate_up's kernel also summing every token's dx (its
// shared-expert row, then its routed dx slots in slot order) and d topk_scores on its producer
// warpgroup's idle warps under its tiles — TokenExchange::reverse_dispatch_filled_dx_slots without
// a launch of its own after them. The same bits as the two apart.
//
// Ordering (one stream): every dx slot filled (the last window's dx tiles: fused::fused_backward)
// and the shared expert's dx in the exchange's shared_dx (its backward) before it; the sums read
// them from the kernel's start. So it serves the last window of a pass, after the shared expert.
#include <cuda_runtime.h>

#include "caracal/comm/world.hpp"
#include "caracal/gemm/expert_pass.hpp"
#include "caracal/transfer/token_exchange.hpp"

namespace caracal::fused {

// Whether weight_grads_with_dx_sums can serve a backward: a world of one rank whose dx slots hold a
// row per route.
bool rides_dx_sums(const comm::World& world, transfer::DxSlots slots);

// `pass`, `grads` as gemm::expert_weight_grads takes them; `router` the one build_schedule used.
// Throws caracal::Error where the world has more than one rank or the exchange has no backward.
void weight_grads_with_dx_sums(comm::World& world, transfer::TokenExchange& exchange,
                               const RouterNormalization& router, const gemm::ExpertPass& pass,
                               const gemm::ExpertPassGradients& grads, cudaStream_t stream);

}  // namespace caracal::fused
