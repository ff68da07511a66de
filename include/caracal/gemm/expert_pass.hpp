#pragma once
// One group of SwiGLU experts over expert-contiguous rows, forward and backward, through the
// grouped-GEMM engine. The routed experts (L experts over the schedule's rows) and the shared
// expert (one expert over the rank's tokens) both run through it.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "caracal/gemm/grouped_gemm.hpp"
#include "caracal/gemm/grouped_gemm_backward.hpp"
#include "caracal/precision_traits.hpp"

namespace caracal::gemm {

// The row buffers of one pass; every one has rows.buffer_rows() rows (rows.row_capacity, or the
// ring's) with zeros in padding rows; the per-row arrays (gates, dg) one per schedule row. The
// GEMMs work on the rows' window (caracal/schedule_view.hpp). x, the activation and dy are rows in
// the layer's precision (LayerRow, caracal/precision_traits.hpp); the others bf16.
struct ExpertPass {
  ScheduleView rows;
  int hidden = 0;                       // D
  int intermediate = 0;                 // I of these experts
  int num_ctas = 0;                     // grouped-GEMM CTAs; 0 = one per SM
  uint32_t* tile_queue = nullptr;       // the row-tile GEMMs' (caracal/gemm/grouped_gemm.hpp), or nullptr
  const LayerRow* x = nullptr;          // [buffer rows][D]
  __nv_bfloat16* gate_up = nullptr;     // [buffer rows][2I] forward output, backward input
  LayerRow* activation = nullptr;       // [buffer rows][I] SwiGLU activation (forward), bf16(g * it) (backward)
  __nv_bfloat16* out = nullptr;         // [buffer rows][D] forward output E(x)
  const LayerRow* dy = nullptr;         // [buffer rows][D] backward input, g not applied
  const float* gates = nullptr;         // [rows] g of each row; 0 on padding rows
  __nv_bfloat16* d_gate_up = nullptr;   // [buffer rows][2I]; may be gate_up (see expert_backward)
  float* dg = nullptr;                  // [rows] backward output <dy, E(x)>
  float* workspace = nullptr;           // gemm::down_dgrad_workspace_floats(rows, I)
  __nv_bfloat16* dx = nullptr;          // [buffer rows][D] backward output; may be x (see expert_backward)
};

// The experts' weights as the layer holds them (MoEWeights: bf16 in any precision).
struct ExpertPassWeights {
  const __nv_bfloat16* w_gate_up = nullptr;  // [experts][2I][D], its rows as w_gate_up_layout says
  const __nv_bfloat16* w_down = nullptr;     // [experts][D][I]
  GateUpLayout w_gate_up_layout = GateUpLayout::kInterleaved;
};

// Where the weight gradients go: fp32, or bf16 (one rounding of the fp32 sums); one of each pair.
struct ExpertPassGradients {
  float* w_gate_up = nullptr;               // [experts][2I][D], its rows as w_gate_up_layout says
  float* w_down = nullptr;                  // [experts][D][I]
  __nv_bfloat16* w_gate_up_bf16 = nullptr;  // instead of w_gate_up
  __nv_bfloat16* w_down_bf16 = nullptr;     // instead of w_down
  // bf16 gradients over a window of the rows (WeightGradArgs::partial_in, partial_out).
  const float* partial_in = nullptr;
  float* partial_out = nullptr;
  GateUpLayout w_gate_up_layout = GateUpLayout::kInterleaved;  // the weights' (ExpertPassWeights)
};

// gate_up and the activation (F1, F2), then out = activation · W_down^T (F3).
void expert_forward(const ExpertPass& pass, const ExpertPassWeights& weights, cudaStream_t stream);
// Its two halves: gate_up and the activation (what backward reads: MoELayer replays this), and out.
void expert_up_gate(const ExpertPass& pass, const ExpertPassWeights& weights, cudaStream_t stream);
void expert_down(const ExpertPass& pass, const ExpertPassWeights& weights, cudaStream_t stream);
// Their GEMMs' arguments (activation_out = pass.activation, gate_up_out = pass.gate_up; y_out = pass.out).
UpGateSwigluArgs up_gate_gemm_args(const ExpertPass& pass, const ExpertPassWeights& weights);
DownProjArgs down_gemm_args(const ExpertPass& pass, const ExpertPassWeights& weights);

// dg, d_gate_up and g·activation (B1, B2), the weight gradients (B5), then dx (B3), written. The
// backward may run in place: d_gate_up over gate_up (the SwiGLU backward reads each chunk's gate/up
// before it stores that chunk's gradient over it, and nothing reads gate_up after), dx over x (the
// weight gradients, x's last reader, run before the dx GEMM). The pass's forward activations are
// then gone: a second backward needs expert_up_gate (and x) again.
void expert_backward(const ExpertPass& pass, const ExpertPassWeights& weights, const ExpertPassGradients& grads,
                     cudaStream_t stream);
// The dgrad+SwiGLU GEMM's arguments of a pass (B1, B2: dg, d_gate_up, g·activation), and the dx
// GEMM's (dx_out = pass.dx).
DownDgradSwigluArgs dgrad_gemm_args(const ExpertPass& pass, const ExpertPassWeights& weights);
GateUpDgradArgs dx_gemm_args(const ExpertPass& pass, const ExpertPassWeights& weights);

// All of it but dx (B1, B2, B5), for a caller that makes dx itself (gemm::gate_up_dgrad_to_home
// stores the rows into their home slots); pass.dx is not written.
void expert_backward_before_dx(const ExpertPass& pass, const ExpertPassWeights& weights,
                               const ExpertPassGradients& grads, cudaStream_t stream);
// The weight gradients alone (B5), for a caller that ran the dgrad itself (the fused backward,
// src/fused/fused_backward.hpp): x, dy, d_gate_up and g·activation read; and their arguments.
void expert_weight_grads(const ExpertPass& pass, const ExpertPassGradients& grads, cudaStream_t stream);
WeightGradArgs weight_grad_args(const ExpertPass& pass, const ExpertPassGradients& grads);

}  // namespace caracal::gemm
