#pragma once
// The routed experts' dx GEMM with reverse dispatch's push in its epilogue (DESIGN §2): dx =
// d_gate_up · W_gate_up[e], the same tiles and bits as gemm::grouped_gate_up_dgrad, each row stored
// straight into its route's slot on its home rank, so no dx row waits in a buffer and the reverse
// dispatch only sums the slots. It writes peers' slots: the caller orders it after a world barrier
// that follows each peer's last read of them, and publishes its stores by a later one.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "caracal/comm/symmetric_ptr.hpp"
#include "caracal/gemm/expert_pass.hpp"

namespace caracal::gemm {

// Where each row of the pass goes: rows[r] = {home rank, route} (the pass's schedule rows), the
// slot `route` of `slots` ([T*k][D] bf16 on every rank) on that rank, through `heaps` (every rank's
// heap base on the device: comm::World::device_heap_table). `rank`: this rank (global).
struct HomeSlots {
  char* const* heaps = nullptr;
  comm::SymmetricPtr<__nv_bfloat16> slots;
  int rank = 0;
};

// `pass`: a routed pass whose rows.rows name each row's home (d_gate_up from the down dgrad; dx not
// written). Enqueues one launch on `stream`. Throws caracal::Error for arguments the dx GEMM refuses.
void gate_up_dgrad_to_home(const ExpertPass& pass, const ExpertPassWeights& weights, const HomeSlots& home,
                           cudaStream_t stream);

}  // namespace caracal::gemm
