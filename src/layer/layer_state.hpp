#pragma once
// What a MoELayer's two plans share: its sizes, its token exchange, and each local rank's buffers
// with the expert passes wired to them and to the rank's heap.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "caracal/comm/cuda_check.hpp"
#include "caracal/comm/world.hpp"
#include "caracal/gemm/expert_pass.hpp"
#include "caracal/gemm/expert_pass_fp8.hpp"
#include "caracal/layer_config.hpp"
#include "caracal/moe_layer.hpp"
#include "caracal/transfer/token_exchange.hpp"
#include "layer/layer_experiments.hpp"
#include "layer/layer_sizes.hpp"
#include "layer/local_buffers.hpp"

namespace caracal::layer {

// One local rank: its own buffers and the two expert passes wired to them and to its heap.
struct RankState {
  LocalMemory local;
  MoELayerBuffers io;             // the exchange's input/output buffers (zero-copy path)
  gemm::ExpertPass routed;        // L experts over the schedule's rows
  gemm::Fp8ExpertPass routed_fp8;  // the same rows in FP8 (LayerSizes::fp8; else unused)
  gemm::Fp8RowOutput home_x_fp8;   // the exchange's x_codes and x_scales (LayerSizes::fp8; else null):
                                   // the shared expert's e4m3 rows too
  gemm::Fp8RowOutput home_dy_fp8;  // its dy_codes and dy_scales (FP8 weight gradients; else null)
  gemm::Fp8RowOutput expert_dy_fp8;  // its expert_dy_codes and expert_dy_scales (likewise)
  uint8_t* weights_fp8 = nullptr;  // where its passes quantize weights not given quantized (MoEWeights::w_fp8;
                                   // layer/fp8_weights.hpp)
  gemm::ExpertPass shared;        // the shared expert over the rank's tokens (unused without one)
  gemm::Fp8ExpertPass shared_fp8;  // the same rows in FP8 (LayerSizes::fp8; else unused)
  __nv_bfloat16* shared_out_slot = nullptr;  // the exchange's shared_out input of combine
  __nv_bfloat16* shared_dx_slot = nullptr;   // the exchange's shared_dx input of reverse_dispatch

  std::vector<const void*> owned() const {
    return {io.x, io.topk_idx, io.topk_scores, io.y, io.dy, io.dx, io.d_topk_scores};
  }
};

struct LayerState {
  LayerConfig config;
  LayerSizes sizes;
  LayerExperiments experiments;
  std::unique_ptr<transfer::TokenExchange> exchange;
  std::vector<RankState> ranks;
};

// Rank l's buffers on the layer's exchange (gemm_ctas and the allocator from `options`).
RankState make_rank_state(const LayerSizes& sizes, const transfer::TokenExchange& exchange, const comm::World& world,
                          int l, const MoELayerOptions& options);

// Copies `count` elements on `stream` unless both name the same buffer (the zero-copy path).
template <typename T>
void copy_unless_same(T* dst, const T* src, int64_t count, cudaStream_t stream, const char* what) {
  if (dst == src) return;
  check_cuda(cudaMemcpyAsync(dst, src, static_cast<size_t>(count) * sizeof(T), cudaMemcpyDeviceToDevice, stream),
             what);
}

// Copies every rank's x, topk_idx, topk_scores into the exchange's buffers, and x and the shared
// expert's scales into its rows.
void stage_inputs(LayerState& state, const std::vector<MoEForwardArgs>& args, cudaStream_t stream);
// The forward's inputs staged again, the shared expert's up/gate and the schedule (and the gates):
// what every plan's backward reads of forward `args`, bitwise as the first time.
void replay_schedule(LayerState& state, const std::vector<MoEForwardArgs>& args, cudaStream_t stream);
// v1's launches up to the dispatch (the separate-launches plans, bf16 and FP8): the shared expert's
// forward, the schedule (and the gates).
void shared_forward_and_schedule(LayerState& state, const std::vector<MoEForwardArgs>& args, cudaStream_t stream);
// The shared expert's backward in launches of its own, its dx copied into the exchange's slot.
void shared_backward(LayerState& state, size_t l, const MoEBackwardArgs& grads, const MoEWeights& weights,
                     cudaStream_t stream);
// Where the shared expert's weight gradients go.
inline gemm::ExpertPassGradients shared_gradients(const MoEBackwardArgs& a) {
  return {a.d_shared_w_gate_up, a.d_shared_w_down, a.d_shared_w_gate_up_bf16, a.d_shared_w_down_bf16};
}
// d_shared_scale out, where the forward was given a shared_scale.
void copy_shared_scale_grad(LayerState& state, size_t l, const MoEBackwardArgs& grads, cudaStream_t stream);

}  // namespace caracal::layer
