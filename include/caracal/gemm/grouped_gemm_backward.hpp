#pragma once
// The Hopper grouped-GEMM engine, backward half (DESIGN §1, §3; contract B1-B5 of
// caracal/reference.hpp), over the rows and padding rules of grouped_gemm.hpp. Per row r of local
// expert e, with g = g_r:
//   1. grouped_down_dgrad_swiglu   d_h = dy · W_down[e] (fp32), dg = <d_h, act> (before g),
//                                  d_gate_up = SwiGLU backward of g·d_h (bf16, interleaved),
//                                  scaled_activation = bf16(g · act)
//   2. grouped_gate_up_dgrad       dx = d_gate_up · W_gate_up[e] (bf16, K = 2I)
//   3. grouped_weight_grads        dW_gate_up[e] = Σ_r d_gate_up[r]^T x[r], dW_down[e] = Σ_r
//                                  dy[r]^T scaled_activation[r] (fp32, or bf16 rounded once)
// Weight gradients: one CTA a tile over all of its expert's rows in schedule order (no split-K),
// zeros for an expert without rows; over consecutive windows bitwise one pass. Everything else as
// grouped_gemm.hpp: padding rows in (g = 0 there) give zeros out, bitwise across runs and
// num_ctas, host checks first, enqueued without synchronising; sm_90a only; no CuTe here.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "caracal/gemm/grouped_gemm.hpp"

namespace caracal::gemm {

// Floats of the workspace grouped_down_dgrad_swiglu needs: one dg partial per row and 256-column
// N tile of I.
size_t down_dgrad_workspace_floats(int row_capacity, int intermediate);

struct DownDgradSwigluArgs {
  ScheduleView rows;
  int hidden = 0;                              // D: the K of this GEMM
  int intermediate = 0;                        // I: its N
  const __nv_bfloat16* dy = nullptr;           // [buffer rows][D], not scaled by g
  const __nv_bfloat16* w_down = nullptr;       // [L][D][I] (I contiguous), as in the forward
  const __nv_bfloat16* gate_up = nullptr;      // [buffer rows][2I] interleaved, forward-saved
  const float* gates = nullptr;                // [row_capacity] g of each row's route
  __nv_bfloat16* d_gate_up_out = nullptr;      // [buffer rows][2I] interleaved like gate_up
  __nv_bfloat16* scaled_activation_out = nullptr;  // [buffer rows][I]: bf16(g · activation); may be
                                               // the forward's activation buffer (not read here)
  float* d_gates_out = nullptr;                // [row_capacity] dL/dg of each row's route
  float* workspace = nullptr;                  // down_dgrad_workspace_floats(...) floats
  int num_ctas = 0;                            // persistent CTAs; 0 = one per SM
  uint32_t* tile_queue = nullptr;  // kTileQueueWords words, or nullptr (caracal/gemm/grouped_gemm.hpp)
};

struct GateUpDgradArgs {
  ScheduleView rows;
  int hidden = 0;                              // D: the N of this GEMM
  int intermediate = 0;                        // I: its K is 2I
  const __nv_bfloat16* d_gate_up = nullptr;    // [buffer rows][2I] interleaved
  const __nv_bfloat16* w_gate_up = nullptr;    // [L][2I][D], its rows as w_gate_up_layout says
  GateUpLayout w_gate_up_layout = GateUpLayout::kInterleaved;  // either: the same dx bits
  __nv_bfloat16* dx_out = nullptr;             // [buffer rows][D]
  int num_ctas = 0;
  uint32_t* tile_queue = nullptr;  // kTileQueueWords words, or nullptr (caracal/gemm/grouped_gemm.hpp)
};

struct WeightGradArgs {
  ScheduleView rows;
  int hidden = 0;                              // D
  int intermediate = 0;                        // I
  const __nv_bfloat16* x = nullptr;            // [buffer rows][D]
  const __nv_bfloat16* dy = nullptr;           // [buffer rows][D], not scaled by g
  const __nv_bfloat16* d_gate_up = nullptr;    // [buffer rows][2I] interleaved
  const __nv_bfloat16* scaled_activation = nullptr;  // [buffer rows][I]
  // Outputs, in fp32 or in bf16: exactly one pointer of each pair. bf16 is the same fp32 sum
  // rounded once to nearest-even bf16 (what autograd yields for bf16 parameters) and halves the
  // bytes stored.
  float* d_w_gate_up = nullptr;                // [L][2I][D], its rows as d_w_gate_up_layout says
  float* d_w_down = nullptr;                   // [L][D][I]
  __nv_bfloat16* d_w_gate_up_bf16 = nullptr;   // [L][2I][D]
  __nv_bfloat16* d_w_down_bf16 = nullptr;      // [L][D][I]
  // The row order dW_gate_up is stored in (that of the W_gate_up it is the gradient of): either
  // holds the same values, rows permuted.
  GateUpLayout d_w_gate_up_layout = GateUpLayout::kInterleaved;
  // bf16 gradients over a window of the rows (rows.first_row > 0 or rows.end_row > 0: a
  // macrobatch of the ring) keep the fp32 sums of an expert whose rows go on outside it here:
  // partial_in, what the window before stopped at (needed with first_row > 0), and partial_out,
  // where this one stops (needed with 0 < end_row < row_capacity), weight_grad_partial_floats(D, I)
  // floats each,
  // two different buffers (the caller alternates them window by window). An fp32 gradient is its
  // own partial sum: then they are not read.
  const float* partial_in = nullptr;
  float* partial_out = nullptr;
  int num_ctas = 0;
};

// Floats of one weight-gradient partial (WeightGradArgs::partial_in, partial_out): one expert's
// fp32 dW_gate_up [2I][D] then dW_down [D][I].
size_t weight_grad_partial_floats(int hidden, int intermediate);

// Argument rules: those of the forward (D and I positive multiples of 64, num_experts >= 1,
// row_capacity a non-negative multiple of 128, expert_offset non-null, num_ctas >= 0), every
// pointer non-null and 16-byte aligned except the row buffers when row_capacity == 0 (then the
// row kernels launch nothing; grouped_weight_grads still writes zero gradients).
void grouped_down_dgrad_swiglu(const DownDgradSwigluArgs& args, cudaStream_t stream);
void grouped_gate_up_dgrad(const GateUpDgradArgs& args, cudaStream_t stream);
void grouped_weight_grads(const WeightGradArgs& args, cudaStream_t stream);

}  // namespace caracal::gemm
