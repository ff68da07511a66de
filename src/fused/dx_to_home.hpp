#pragma once
// The routed experts' dx GEMM with reverse dispatch's push done by its epilogue (DESIGN §2): dx =
// d_gate_up · W_gate_up[e], the same tiles and bits as gemm::grouped_gate_up_dgrad, each row stored
// straight into dx_slots[src_route] of its home rank, so no dx row waits in a buffer of the
// worst-case size and TokenExchange::reverse_dispatch_filled_dx_slots only sums the slots. A step
// towards the fused backward (issue 15): the push rides on the GEMM's epilogue, hidden under its
// mainloop.
//
// Ordering: it writes peers' dx_slots, which each peer last read in its previous backward's
// reverse dispatch; the reverse_combine launch before it (entry barrier) follows those. Its
// stores are published to the homes by reverse_dispatch_filled_dx_slots's entry barrier.
#include <cuda_runtime.h>

#include "caracal/comm/world.hpp"
#include "caracal/gemm/expert_pass.hpp"
#include "caracal/transfer/token_exchange.hpp"

namespace caracal::fused {

// `pass`: local rank `local_rank`'s routed pass (rows = the exchange's schedule view of it;
// d_gate_up from the down dgrad; dx not written). Enqueues one launch on `stream`. Throws
// caracal::Error for arguments the dx GEMM refuses or rows that are not the exchange's.
void gate_up_dgrad_to_home(const comm::World& world, const transfer::TokenExchange& exchange, int local_rank,
                           const gemm::ExpertPass& pass, const gemm::ExpertPassWeights& weights, cudaStream_t stream);

}  // namespace caracal::fused
