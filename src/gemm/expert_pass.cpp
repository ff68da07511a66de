#include "caracal/gemm/expert_pass.hpp"

#include "caracal/gemm/grouped_gemm_backward.hpp"
#include "gemm/pass_args.hpp"

namespace caracal::gemm {

void expert_forward(const ExpertPass& pass, const ExpertPassWeights& weights, cudaStream_t stream) {
  expert_up_gate(pass, weights, stream);
  expert_down(pass, weights, stream);
}

void expert_up_gate(const ExpertPass& pass, const ExpertPassWeights& weights, cudaStream_t stream) {
  gemm::grouped_up_gate_swiglu(up_gate_gemm_args(pass, weights), stream);
}

void expert_down(const ExpertPass& pass, const ExpertPassWeights& weights, cudaStream_t stream) {
  gemm::grouped_down_proj(down_gemm_args(pass, weights), stream);
}

UpGateSwigluArgs up_gate_gemm_args(const ExpertPass& pass, const ExpertPassWeights& weights) {
  auto up = pass_args<UpGateSwigluArgs>(pass);
  up.x = pass.x;
  up.w_gate_up = weights.w_gate_up;
  up.w_gate_up_layout = weights.w_gate_up_layout;
  up.activation_out = pass.activation;
  up.gate_up_out = pass.gate_up;  // backward recomputes SwiGLU from it
  up.tile_queue = pass.tile_queue;
  return up;
}

DownProjArgs down_gemm_args(const ExpertPass& pass, const ExpertPassWeights& weights) {
  auto down = pass_args<DownProjArgs>(pass);
  down.activation = pass.activation;
  down.w_down = weights.w_down;
  down.y_out = pass.out;
  down.tile_queue = pass.tile_queue;
  return down;
}

void expert_backward_before_dx(const ExpertPass& pass, const ExpertPassWeights& weights,
                               const ExpertPassGradients& grads, cudaStream_t stream) {
  // g enters after the dot product, so dg stays exact where g = 0 (DESIGN §3).
  gemm::grouped_down_dgrad_swiglu(dgrad_gemm_args(pass, weights), stream);
  expert_weight_grads(pass, grads, stream);
}

void expert_weight_grads(const ExpertPass& pass, const ExpertPassGradients& grads, cudaStream_t stream) {
  // The weight gradients before dx: their last read of x comes before dx may overwrite it.
  gemm::grouped_weight_grads(weight_grad_args(pass, grads), stream);
}

WeightGradArgs weight_grad_args(const ExpertPass& pass, const ExpertPassGradients& grads) {
  auto wgrad = pass_args<WeightGradArgs>(pass);
  wgrad.x = pass.x;
  wgrad.dy = pass.dy;
  wgrad.d_gate_up = pass.d_gate_up;
  wgrad.scaled_activation = pass.activation;
  wgrad.d_w_gate_up = grads.w_gate_up;
  wgrad.d_w_down = grads.w_down;
  wgrad.d_w_gate_up_bf16 = grads.w_gate_up_bf16;
  wgrad.d_w_gate_up_layout = grads.w_gate_up_layout;
  wgrad.d_w_down_bf16 = grads.w_down_bf16;
  wgrad.partial_in = grads.partial_in;
  wgrad.partial_out = grads.partial_out;
  return wgrad;
}

DownDgradSwigluArgs dgrad_gemm_args(const ExpertPass& pass, const ExpertPassWeights& weights) {
  auto dgrad = pass_args<DownDgradSwigluArgs>(pass);
  dgrad.dy = pass.dy;
  dgrad.w_down = weights.w_down;
  dgrad.gate_up = pass.gate_up;
  dgrad.gates = pass.gates;
  dgrad.d_gate_up_out = pass.d_gate_up;
  dgrad.scaled_activation_out = pass.activation;
  dgrad.d_gates_out = pass.dg;
  dgrad.workspace = pass.workspace;
  dgrad.tile_queue = pass.tile_queue;
  return dgrad;
}

void expert_backward(const ExpertPass& pass, const ExpertPassWeights& weights, const ExpertPassGradients& grads,
                     cudaStream_t stream) {
  expert_backward_before_dx(pass, weights, grads, stream);
  gemm::grouped_gate_up_dgrad(dx_gemm_args(pass, weights), stream);
}

GateUpDgradArgs dx_gemm_args(const ExpertPass& pass, const ExpertPassWeights& weights) {
  auto dx = pass_args<GateUpDgradArgs>(pass);
  dx.d_gate_up = pass.d_gate_up;
  dx.w_gate_up = weights.w_gate_up;
  dx.w_gate_up_layout = weights.w_gate_up_layout;
  dx.dx_out = pass.dx;
  dx.tile_queue = pass.tile_queue;
  return dx;
}

}  // namespace caracal::gemm
