#pragma once
// One group of SwiGLU experts in DeepSeek-V3's FP8 recipe over expert-contiguous rows, forward and
// backward (issue 47): the bf16 rows quantized per 1 x 128 block, the FP8 GEMMs
// (caracal/gemm/grouped_gemm_fp8.hpp, grouped_gemm_backward_fp8.hpp) on the experts' e4m3 weights,
// the weight gradients by the FP8 GEMMs on the rows quantized down their columns, or by the bf16
// GEMMs (caracal/gemm/expert_pass.hpp's) on the bf16 rows. Rows, padding, determinism and the
// in-place rules as the bf16 pass's (caracal/gemm/expert_pass.hpp).
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "caracal/gemm/expert_pass.hpp"
#include "caracal/gemm/grouped_gemm_backward_fp8.hpp"
#include "caracal/gemm/grouped_gemm_fp8.hpp"

namespace caracal::gemm {

// The row buffers of one FP8 pass: every one has rows.buffer_rows() rows; the e4m3 ones in the
// layout the FP8 GEMMs read (Fp8RowOutput: codes [buffer rows][K], scales [K / 128][buffer rows]),
// written by the pass from their bf16 twins (x_fp8 by the pass or given, the activation's and
// d_gate_up's by the GEMM epilogues that make them). D and I are multiples of 128.
struct Fp8ExpertPass {
  ScheduleView rows;
  int hidden = 0;                       // D
  int intermediate = 0;                 // I
  int num_ctas = 0;                     // grouped-GEMM CTAs; 0 = one per SM
  uint32_t* tile_queue = nullptr;       // the GEMMs' (caracal/gemm/grouped_gemm.hpp), or nullptr
  // [buffer rows][D] (the weight gradients quantize its columns too), or, in the backward with FP8
  // weight gradients, null: x's columns then quantized from x_fp8's e4m3 rows (DeepSeek-V3's
  // requantization; x_columns must then take memory of its own).
  const __nv_bfloat16* x = nullptr;
  Fp8RowOutput x_fp8;                   // K = D: x quantized (forward)
  // Or x read where the tokens are (a world of one rank: no dispatch of x_fp8's rows first): the
  // tokens' e4m3 rows, schedule row r being route rows.rows[r].y (token route / top_k). Then the
  // up/gate gathers them (Fp8XRows::kGiven) and, with FP8 weight gradients and x
  // null, x's columns are quantized from them; x_fp8 is not read.
  Fp8TokenRows x_tokens;
  int top_k = 0;
  __nv_bfloat16* gate_up = nullptr;     // [buffer rows][2I] forward output, backward input
  __nv_bfloat16* activation = nullptr;  // [buffer rows][I] bf16(g * SwiGLU activation) (backward)
  Fp8RowOutput activation_fp8;          // K = I: the activation quantized (the forward's up/gate epilogue)
  __nv_bfloat16* out = nullptr;         // [buffer rows][D] forward output E(x)
  // [buffer rows][D] backward input, g not applied; or, with FP8 weight gradients, null: dy_fp8
  // then holds its rows already (pulled in e4m3) and dy's columns are quantized from them.
  const __nv_bfloat16* dy = nullptr;
  Fp8RowOutput dy_fp8;                  // K = D: dy quantized (backward), or given
  const float* gates = nullptr;         // [rows] g of each row; 0 on padding rows
  __nv_bfloat16* d_gate_up = nullptr;   // [buffer rows][2I]; may be gate_up
  Fp8RowOutput d_gate_up_fp8;           // K = 2I: d_gate_up in e4m3 (the dx GEMM's operand)
  float* dg = nullptr;                  // [rows] backward output <dy, E(x)>
  float* workspace = nullptr;           // fp8_down_dgrad_workspace_floats(rows.row_capacity, I)
  __nv_bfloat16* dx = nullptr;          // [buffer rows][D] backward output; may be x
  // The weight gradients in FP8: the four operands of B5 quantized down their columns (K = D, D, 2I,
  // I), written by the backward, all given or all null (the bf16 weight-gradient GEMMs on the bf16
  // rows instead); with them the pass runs over the whole schedule (no ring or window).
  // Each may take the memory of the e4m3 rows of its K that the backward is done with when it is
  // written (equal sizes): x_columns x_fp8's, activation_columns activation_fp8's, dy_columns
  // dy_fp8's (written after the dgrad), d_gate_up_columns d_gate_up_fp8's (after dx).
  Fp8ColumnOutput x_columns, dy_columns, d_gate_up_columns, activation_columns;

  // Any of them given (expert_backward then checks that all are).
  bool fp8_weight_grads() const {
    for (const Fp8ColumnOutput* c : {&x_columns, &dy_columns, &d_gate_up_columns, &activation_columns}) {
      if (c->codes_t != nullptr || c->scales != nullptr) return true;
    }
    return false;
  }
};

// The experts' weights in e4m3 with their 128 x 128 block scales, each in both orientations (FP8
// wgmma reads K-major operands only): quant::QuantizeWeightsArgs' codes / scales and codes_t /
// scales_t of W_gate_up [L][2I][D] (interleaved rows, grouped_gemm.hpp's gate_up_row) and of
// W_down [L][D][I].
struct Fp8ExpertWeights {
  Fp8WeightOperand w_gate_up;    // N = 2I, K = D
  Fp8WeightOperand w_gate_up_t;  // [L][D][2I]: N = D, K = 2I
  Fp8WeightOperand w_down;       // N = D, K = I
  Fp8WeightOperand w_down_t;     // [L][I][D]: N = I, K = D
};

// Where quantize_expert_weights writes them: the sizes in bytes (codes) and floats (scales) of a
// group of `experts` experts, and the buffers.
struct Fp8ExpertWeightSizes {
  size_t w_gate_up_codes = 0;     // each orientation's
  size_t w_gate_up_scales = 0;    // [L][D / 128][row of 2I / 128 blocks]
  size_t w_gate_up_scales_t = 0;  // [L][2I / 128][row of D / 128 blocks]
  size_t w_down_codes = 0;
  size_t w_down_scales = 0;       // [L][I / 128][row of D / 128 blocks]
  size_t w_down_scales_t = 0;     // [L][D / 128][row of I / 128 blocks]
};
Fp8ExpertWeightSizes fp8_expert_weight_sizes(int experts, int hidden, int intermediate);

struct Fp8ExpertWeightBuffers {
  __nv_fp8_e4m3* w_gate_up_codes = nullptr;
  float* w_gate_up_scales = nullptr;
  __nv_fp8_e4m3* w_gate_up_codes_t = nullptr;
  float* w_gate_up_scales_t = nullptr;
  __nv_fp8_e4m3* w_down_codes = nullptr;
  float* w_down_scales = nullptr;
  __nv_fp8_e4m3* w_down_codes_t = nullptr;
  float* w_down_scales_t = nullptr;

  Fp8ExpertWeights operands() const;
};

// All of them in one block: its size in bytes (each buffer 256-byte aligned), and the buffers carved
// from `block` (256-byte aligned, that many bytes) in a fixed order, the one MoELayer::quantize_weights
// writes and MoEWeights::w_fp8 names.
size_t fp8_expert_weight_bytes(int experts, int hidden, int intermediate);
Fp8ExpertWeightBuffers fp8_expert_weight_buffers(void* block, int experts, int hidden, int intermediate);
// The operands of a block quantize_expert_weights wrote (read only).
Fp8ExpertWeights fp8_expert_weight_operands(const void* block, int experts, int hidden, int intermediate);

// The bf16 weights (interleaved W_gate_up: weights.w_gate_up_layout must be kInterleaved) into
// `out`, exact scales. Enqueued on `stream`.
void quantize_expert_weights(const ExpertPassWeights& weights, int experts, int hidden, int intermediate,
                             const Fp8ExpertWeightBuffers& out, cudaStream_t stream);

// Where the forward finds its rows: in pass.x, which it quantizes into pass.x_fp8, or in pass.x_fp8
// already (quantized at home and pulled in e4m3: transfer::TokenExchange::dispatch_fp8; pass.x is
// then not read).
enum class Fp8XRows { kQuantize, kGiven };

// x quantized, gate_up and the activation in e4m3 (F1, F2), out (F3).
void expert_forward(const Fp8ExpertPass& pass, const Fp8ExpertWeights& weights, cudaStream_t stream,
                    Fp8XRows x = Fp8XRows::kQuantize);
// Its two halves: x quantized, gate_up (what backward reads: MoELayer replays this) and the
// activation in e4m3; then out.
void expert_up_gate(const Fp8ExpertPass& pass, const Fp8ExpertWeights& weights, cudaStream_t stream,
                    Fp8XRows x = Fp8XRows::kQuantize);
void expert_down(const Fp8ExpertPass& pass, const Fp8ExpertWeights& weights, cudaStream_t stream);
// Their GEMMs' arguments, x read as given (pass.x_tokens, else pass.x_fp8): activation_fp8_out =
// pass.activation_fp8, gate_up_out = pass.gate_up; activation = pass.activation_fp8, y_out = pass.out.
Fp8UpGateSwigluArgs up_gate_gemm_args(const Fp8ExpertPass& pass, const Fp8ExpertWeights& weights);
Fp8DownProjArgs down_gemm_args(const Fp8ExpertPass& pass, const Fp8ExpertWeights& weights);
// The backward's GEMMs' arguments as expert_backward runs them, dy read from pass.dy_fp8:
// d_gate_up_out = pass.d_gate_up, d_gate_up_fp8_out = pass.d_gate_up_fp8, scaled_activation_out =
// pass.activation, d_gates_out = pass.dg; then d_gate_up = pass.d_gate_up_fp8, dx_out = pass.dx.
Fp8DownDgradSwigluArgs dgrad_gemm_args(const Fp8ExpertPass& pass, const Fp8ExpertWeights& weights);
Fp8GateUpDgradArgs dx_gemm_args(const Fp8ExpertPass& pass, const Fp8ExpertWeights& weights);
// dy quantized, dg, d_gate_up (bf16 and e4m3) and g·activation (B1, B2), dx (B3) from the e4m3
// d_gate_up and the weight gradients (B5: x, dy, d_gate_up, g·activation), in FP8 from their
// column quantizations (pass.fp8_weight_grads(): x, dy and g·activation quantized before dx,
// d_gate_up after it; fp32 or bf16 gradients over the whole schedule, no partials) or from the bf16
// rows (before dx). In place as the bf16 pass may run (d_gate_up over gate_up, dx over x).
// grads.w_gate_up_layout must be kInterleaved.
void expert_backward(const Fp8ExpertPass& pass, const Fp8ExpertWeights& weights, const ExpertPassGradients& grads,
                     cudaStream_t stream);

// Two parts of expert_backward for a caller that runs its GEMMs apart (the fused FP8 backward):
// pass.dy's bf16 rows into pass.dy_fp8 (what the dgrad reads); and, once the dgrad and dx have run
// with dx not over x, the FP8 weight gradients (pass.fp8_weight_grads() required): x's, dy's,
// g·activation's and d_gate_up's columns, then the GEMMs, the same bits as expert_backward's.
void quantize_dy_rows(const Fp8ExpertPass& pass, cudaStream_t stream);
void expert_weight_grads(const Fp8ExpertPass& pass, const ExpertPassGradients& grads, cudaStream_t stream);

}  // namespace caracal::gemm
