#pragma once
// The router normalization on the home rank (DESIGN §1), forward and backward, with every float
// operation spelled out so a host twin reproduces the bits:
//   S      = sum of the routed slots' scores, in slot order (__fadd_rn from 0)
//   g_l    = (scale / S) * s_l  (normalize)   or   scale * s_l;   0 for unrouted slots
//   ds_l   = (scale / S) * (dg_l - W / S) with W = sum_j dg_j * s_j (__fmaf_rn, slot order)
//            (normalize: the Jacobian of g, = scale * (dg_l / S - W / S^2))   or   scale * dg_l;
//            0 for unrouted slots.
// With normalization, a token whose routed scores sum to exactly 0 has no defined weights: its g
// and ds are all 0 (its routed experts contribute nothing; the shared expert still does), as in
// the references. Tokens without routed slots are all zeros too.
#include <cstdint>

#include "device/transfer/device_params.hpp"
#include "device/transfer/routing_fault.cuh"
#include "device/transfer/row_copy.cuh"

namespace caracal::transfer {

__device__ inline float routed_score_sum(const int32_t* ids, const float* scores, int num_experts, int top_k) {
  float sum = 0.0f;
  for (int slot = 0; slot < top_k; ++slot) {
    if (is_routed(ids[slot], num_experts)) sum = __fadd_rn(sum, scores[slot]);
  }
  return sum;
}

// scale / S, or 0 where S = 0 (see above).
__device__ inline float normalization_factor(float scale, float sum) {
  return sum != 0.0f ? __fdiv_rn(scale, sum) : 0.0f;
}

// One warp: the factor of one token's gates (g_l = factor * s_l at routed slots), the same value
// on every lane and the same bits as token_gates: lane j loads slot j (rounds of 32: one load per
// lane and round, as `ids` and `scores` may live on another GPU) and the sum runs in slot order
// through shuffles.
__device__ inline float warp_gate_factor(const int32_t* ids, const float* scores, int num_experts, int top_k,
                                         RouterScaling router, int lane) {
  if (!router.normalize) return router.scale;
  float sum = 0.0f;
  for (int base = 0; base < top_k; base += kWarpSize) {
    const int slot = base + lane;
    const bool routed = slot < top_k && is_routed(ids[slot], num_experts);
    const float score = routed ? scores[slot] : 0.0f;
    const unsigned routed_lanes = __ballot_sync(~0u, routed);
    for (int j = 0; j < kWarpSize && base + j < top_k; ++j) {
      const float s = __shfl_sync(~0u, score, j);
      if ((routed_lanes >> j) & 1u) sum = __fadd_rn(sum, s);
    }
  }
  return normalization_factor(router.scale, sum);
}

// One thread: g of one token's k slots (`gates` overlaps neither input, so the loads of the slots
// need not wait for the stores).
__device__ inline void token_gates(const int32_t* __restrict__ ids, const float* __restrict__ scores, int num_experts,
                                   int top_k, RouterScaling router, float* __restrict__ gates) {
  const float factor = router.normalize
                           ? normalization_factor(router.scale, routed_score_sum(ids, scores, num_experts, top_k))
                           : router.scale;
  for (int slot = 0; slot < top_k; ++slot) {
    gates[slot] = is_routed(ids[slot], num_experts) ? __fmul_rn(factor, scores[slot]) : 0.0f;
  }
}

// One warp: d topk_scores of one token's k slots from dL/dg (`dg`, pushed during this launch and
// ordered by a world barrier; read only at routed slots). Every lane computes the sums in the same
// order; lanes write the slots.
__device__ inline void token_score_gradients(const int32_t* ids, const float* scores, const float* dg, int num_experts,
                                             int top_k, RouterScaling router, float* d_scores, int lane) {
  float factor = router.scale;
  float mean = 0.0f;
  if (router.normalize) {
    float sum = 0.0f;
    float weighted = 0.0f;
#pragma unroll 1  // k is small; unrolled, its lane offsets spill on a warp's 56-register budget
    for (int slot = 0; slot < top_k; ++slot) {
      if (!is_routed(ids[slot], num_experts)) continue;
      sum = __fadd_rn(sum, scores[slot]);
      weighted = __fmaf_rn(load_coherent_f32(dg + slot), scores[slot], weighted);
    }
    factor = normalization_factor(router.scale, sum);
    mean = sum != 0.0f ? __fdiv_rn(weighted, sum) : 0.0f;
  }
#pragma unroll 1
  for (int slot = lane; slot < top_k; slot += kWarpSize) {
    float d = 0.0f;
    if (is_routed(ids[slot], num_experts)) {
      const float g = load_coherent_f32(dg + slot);
      d = router.normalize ? __fmul_rn(factor, __fsub_rn(g, mean)) : __fmul_rn(router.scale, g);
    }
    d_scores[slot] = d;
  }
}

}  // namespace caracal::transfer
