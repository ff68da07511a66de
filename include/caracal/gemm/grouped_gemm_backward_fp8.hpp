#pragma once
// The backward's row-direction grouped GEMMs in DeepSeek-V3's FP8 recipe (issue 47): the dgrad of
// down with the SwiGLU backward, and dx. Operands and accumulation as the FP8 forward GEMMs'
// (caracal/gemm/grouped_gemm_fp8.hpp: e4m3 codes, 1 x 128 row scales along K, 128 x 128 weight
// scales, fp32 accumulators promoted per 128-wide K block, one CTA a tile: caracal/gemm/gemm_tiles.hpp); the
// weights in their transposed copies (FP8 wgmma reads K-major operands only). Outputs, rows,
// padding, determinism, g and dL/dg as caracal/gemm/grouped_gemm_backward.hpp says of the bf16
// kernels, with D and I multiples of 128. Each GEMM's fp32 result equals the fp64 GEMM of its
// dequantized operands to within fp32 accumulation, before the outputs' roundings.
//
// This header stays free of CuTe so plain host code (tests, tools) can include it.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "caracal/gemm/gemm_tiles.hpp"  // fp8_dgrad_wide_tiles: the dgrad's tile by shape
#include "caracal/gemm/grouped_gemm_fp8.hpp"
#include "caracal/schedule_view.hpp"

namespace caracal::gemm {

// Floats of the workspace of the FP8 grouped_down_dgrad_swiglu: one dg partial per row and
// 128-column N tile of I (enough for its 256-column tiles too).
size_t fp8_down_dgrad_workspace_floats(int row_capacity, int intermediate);


// grouped_down_dgrad_swiglu in FP8: d_h = dy · W_down[e] (fp32), then the bf16 kernel's epilogue
// (B1, B2, B5), and d_gate_up once more in e4m3 for the FP8 dx GEMM: its codes and scales are
// quant::quantize_rows of d_gate_up_out (exact scales), bit for bit.
struct Fp8DownDgradSwigluArgs {
  ScheduleView rows;
  int hidden = 0;                     // D: the K of this GEMM
  int intermediate = 0;               // I: its N
  Fp8RowOperand dy;                   // K = D, not scaled by g
  Fp8WeightOperand w_down_t;          // W_down transposed, [L][I][D]: N = I, K = D (quantize_weights'
                                      // codes_t, scales_t of W_down, n = D, k = I)
  const __nv_bfloat16* gate_up = nullptr;  // [buffer rows][2I] interleaved, forward-saved
  const float* gates = nullptr;            // [row_capacity] g of each row's route
  __nv_bfloat16* d_gate_up_out = nullptr;  // [buffer rows][2I] interleaved (the weight gradients'
                                           // operand); may be gate_up (in place)
  Fp8RowOutput d_gate_up_fp8_out;          // K = 2I: the dx GEMM's d_gate_up
  __nv_bfloat16* scaled_activation_out = nullptr;  // [buffer rows][I]: bf16(g · activation)
  float* d_gates_out = nullptr;            // [row_capacity] dL/dg of each row's route
  float* workspace = nullptr;              // fp8_down_dgrad_workspace_floats(...) floats
  int num_ctas = 0;                        // persistent CTAs; 0 = one per SM
  uint32_t* tile_queue = nullptr;          // kTileQueueWords words, or nullptr
};

// grouped_gate_up_dgrad in FP8: dx = bf16(d_gate_up · W_gate_up[e]) over K = 2I (B3), its rows
// stored as they are.
struct Fp8GateUpDgradArgs {
  ScheduleView rows;
  int hidden = 0;                  // D: the N of this GEMM
  int intermediate = 0;            // I: its K is 2I
  Fp8RowOperand d_gate_up;         // K = 2I, interleaved (Fp8DownDgradSwigluArgs::d_gate_up_fp8_out)
  Fp8WeightOperand w_gate_up_t;    // W_gate_up transposed, [L][D][2I]: N = D, K = 2I interleaved
                                   // (quantize_weights' codes_t, scales_t of W_gate_up, n = 2I, k = D)
  __nv_bfloat16* dx_out = nullptr;  // [buffer rows][D]
  int num_ctas = 0;
  uint32_t* tile_queue = nullptr;
};

// Rows [buffer rows][K] quantized down their columns (quant::quantize_columns with codes_row_stride
// = buffer rows, scale_col_stride 1, scale_block_stride K): the codes transposed, value (r, c) at
// codes_t[c * buffer rows + r], and one scale per column and 128-row block, scales[(r / 128) * K + c].
// A 128-row block never straddles two experts (every expert's segment starts at a multiple of 128).
struct Fp8ColumnOperand {
  const __nv_fp8_e4m3* codes_t = nullptr;  // [K][buffer rows]
  const float* scales = nullptr;           // [buffer rows / 128][K]
};

// Where rows quantized down their columns are written (quant::quantize_columns), in the layout
// Fp8ColumnOperand reads.
struct Fp8ColumnOutput {
  __nv_fp8_e4m3* codes_t = nullptr;  // [K][buffer rows]
  float* scales = nullptr;           // [buffer rows / 128][K]
};

// grouped_weight_grads in FP8 (B5): dW_gate_up[e] = d_gate_up^T x and dW_down[e] = dy^T (g hidden)
// over e's rows, each operand quantized down its columns, promoted every 128 rows with both
// operands' scales, the fp32 sums stored in fp32 or rounded once to bf16 (experts without rows get
// zeros). Over the whole schedule only (rows.ring_rows, first_row and end_row 0: no ring or
// window). The fp32 sums equal the fp64 sums of the dequantized operands' products to within fp32
// accumulation.
struct Fp8WeightGradArgs {
  ScheduleView rows;
  int hidden = 0;        // D
  int intermediate = 0;  // I
  Fp8ColumnOperand x;                  // K = D
  Fp8ColumnOperand dy;                 // K = D, not scaled by g
  Fp8ColumnOperand d_gate_up;          // K = 2I interleaved
  Fp8ColumnOperand scaled_activation;  // K = I
  // Outputs in fp32 or in bf16: exactly one pointer of each pair (as WeightGradArgs').
  float* d_w_gate_up = nullptr;               // [L][2I][D], rows interleaved (gate_up_row)
  float* d_w_down = nullptr;                  // [L][D][I]
  __nv_bfloat16* d_w_gate_up_bf16 = nullptr;  // [L][2I][D]
  __nv_bfloat16* d_w_down_bf16 = nullptr;     // [L][D][I]
  int num_ctas = 0;                           // persistent CTAs; 0 = one per SM
};

// Argument rules: as the bf16 kernels', with D and I positive multiples of 128 and every codes and
// scales pointer non-null and 16-byte aligned (those of rows may be null with row_capacity 0).
// Each throws caracal::Error naming the argument before any CUDA call, then enqueues its kernels on
// `stream` without synchronising. Hopper (sm_90a) only.
void grouped_down_dgrad_swiglu(const Fp8DownDgradSwigluArgs& args, cudaStream_t stream);
void grouped_gate_up_dgrad(const Fp8GateUpDgradArgs& args, cudaStream_t stream);
void grouped_weight_grads(const Fp8WeightGradArgs& args, cudaStream_t stream);

}  // namespace caracal::gemm
