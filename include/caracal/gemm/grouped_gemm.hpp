#pragma once
// The Hopper grouped-GEMM engine, forward half: the routed experts' SwiGLU feed-forward over the
// expert-contiguous rows of one rank (DESIGN §2, §3). The backward half, over the same rows, is in
// caracal/gemm/grouped_gemm_backward.hpp.
//
// Rows. The kernels read the rank's schedule view (caracal/schedule_view.hpp, the same view the
// transfers read): local expert e owns schedule rows [expert_offset[e], expert_offset[e+1]); the
// first expert_count[e] of them are real routes, the rest padding up to a multiple of
// kGroupedGemmTileM (128) rows. Both arrays live in DEVICE memory and are read by the kernels
// only: the host never learns the counts, so every call can be captured in a CUDA graph. Rows
// past row_capacity are never touched whatever the offsets say. The kernels work on the view's
// window of rows [first_row, end_row) (the whole schedule by default). Row buffers ("[buffer
// rows]") have rows.buffer_rows() rows: one per schedule row, or over a ring (ring_rows > 0) the
// ring's, the window then being (part of) one macrobatch in buffer rows [0, end_row - first_row)
// (caracal/schedule_view.hpp); arrays of one value per row ("[row_capacity]") stay one per
// schedule row.
//
// Padding rows. The row buffers' padding rows must hold zeros on input (dispatch zeroes them).
// Every row of every 128-row block of an expert is then written, padding rows with zeros (+-0):
// the outputs are a pure function of the real inputs, bitwise. When expert_count is given, the
// kernels skip the tensor-core work of 64-row halves that hold no real row and store zeros
// there; the outputs are the same as without it. Rows at or past expert_offset[L] are untouched.
//
// Determinism. Each output tile is computed by one CTA with a fixed K order and rounded once, so
// results are bitwise identical across runs and across grid sizes (num_ctas).
//
// CTA pairs. The row-tile kernels (these two, and the backward's dgrad and dx) run their CTAs as
// clusters of two that take two tiles at a time and read the operand the tiles share once, by TMA
// multicast: num_ctas is rounded up to an even count, and 0 means as many pairs as the GPU runs at
// once.
//
// Both functions validate their arguments on the host first and throw caracal::Error naming the
// argument and the value expected, before any CUDA call; then they enqueue one kernel on
// `stream` (no synchronisation) and throw caracal::Error if the launch fails. Hopper (sm_90a) only.
//
// This header stays free of CuTe so plain host code (tests, tools) can include it.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "caracal/schedule_view.hpp"

namespace caracal::gemm {

// Every expert's row segment is padded to this many rows (the GEMMs' M tile).
inline constexpr int kGroupedGemmTileM = 128;

// A tile queue (the args' tile_queue): device memory of this many uint32_t words, owned by the
// caller, which the row-tile GEMMs (up/gate, down, dgrad, dx) hand their tiles out from, in order,
// so that the tiles in flight share their operands in L2 (faster; the results are the same bits
// without it). The launcher zeroes it before each launch; two kernels running at the same time must
// not share one; 16-byte aligned. At most kTileQueueMaxCtas CTAs (num_ctas) use one.
inline constexpr int kTileQueueMaxCtas = 256;
inline constexpr int kTileQueueMaxStages = 8;  // of any GEMM's stage ring
inline constexpr int kTileQueueWords = 8 + kTileQueueMaxCtas * kTileQueueMaxStages;  // a counter, a slot per CTA and stage

// D and I must be positive multiples of this (one 128-byte swizzled K tile of bf16).
inline constexpr int kGroupedGemmDimAlignment = 64;
// Gate and up weight rows alternate in groups of this many (see gate_up_row below).
inline constexpr int kGateUpInterleave = 8;

// The interleaved up/gate layout. W_gate_up[e] is [2I][D] with
//     W_gate_up[e][gate_up_row(j, false)] = W_gate[e][j],
//     W_gate_up[e][gate_up_row(j, true)]  = W_up[e][j],        j in [0, I),
// i.e. rows alternate 8 gate rows, 8 up rows. Why 8: a wgmma accumulator gives each thread
// columns {8t + 2q, 8t + 2q + 1} for every 8-column group t, so with this interleave the thread
// holding gate_j also holds up_j, in the neighbouring group, and SwiGLU needs no data exchange.
// The stored gate_up output uses the same column order: gate_up[row][gate_up_row(j, up)].
constexpr int64_t gate_up_row(int64_t j, bool is_up) {
  return 2 * kGateUpInterleave * (j / kGateUpInterleave) + (is_up ? kGateUpInterleave : 0) +
         j % kGateUpInterleave;
}

// Host version of interleave_gate_up_weights for any 2-byte element type (bf16 bits,
// __nv_bfloat16): w_gate, w_up: [L][I][D]; w_gate_up: [L][2I][D]. I must be a multiple of
// kGateUpInterleave.
template <typename T>
void interleave_gate_up_weights_host(const T* w_gate, const T* w_up, T* w_gate_up,
                                     int64_t num_experts, int64_t intermediate, int64_t hidden) {
  for (int64_t e = 0; e < num_experts; ++e) {
    for (int64_t j = 0; j < intermediate; ++j) {
      const T* gate_row = w_gate + (e * intermediate + j) * hidden;
      const T* up_row = w_up + (e * intermediate + j) * hidden;
      T* gate_dst = w_gate_up + (e * 2 * intermediate + gate_up_row(j, false)) * hidden;
      T* up_dst = w_gate_up + (e * 2 * intermediate + gate_up_row(j, true)) * hidden;
      for (int64_t d = 0; d < hidden; ++d) {
        gate_dst[d] = gate_row[d];
        up_dst[d] = up_row[d];
      }
    }
  }
}

// The same on the device (all three pointers device memory, 16-byte aligned; D a multiple of 8,
// I a multiple of kGateUpInterleave). Enqueues one kernel on `stream`; throws caracal::Error on
// bad arguments or a failed launch.
void interleave_gate_up_weights(const __nv_bfloat16* w_gate, const __nv_bfloat16* w_up,
                                __nv_bfloat16* w_gate_up, int num_experts, int intermediate,
                                int hidden, cudaStream_t stream);


// Forward up/gate + SwiGLU, per row r of expert e:
//   gate_up = bf16(x[r] · W_gate_up[e]^T)                 (contract F1, interleaved columns)
//   activation = bf16(SiLU(gate) * up) from the rounded gate/up (F2)
struct UpGateSwigluArgs {
  ScheduleView rows;
  int hidden = 0;                            // D: the K of this GEMM
  int intermediate = 0;                      // I: activation_out has I columns, the GEMM N = 2I
  const __nv_bfloat16* x = nullptr;          // [buffer rows][D]
  const __nv_bfloat16* w_gate_up = nullptr;  // [L][2I][D], interleaved as above
  __nv_bfloat16* activation_out = nullptr;       // [buffer rows][I]
  __nv_bfloat16* gate_up_out = nullptr;      // [buffer rows][2I], interleaved; nullptr: not stored
  int num_ctas = 0;                          // persistent CTAs; 0 = one per SM
  uint32_t* tile_queue = nullptr;           // kTileQueueWords words, or nullptr (see above)
};

// Forward down projection: y[r] = bf16(activation[r] · W_down[e]^T)  (contract F3).
struct DownProjArgs {
  ScheduleView rows;
  int hidden = 0;                            // D: the N of this GEMM
  int intermediate = 0;                      // I: the K of this GEMM
  const __nv_bfloat16* activation = nullptr;  // [buffer rows][I]
  const __nv_bfloat16* w_down = nullptr;     // [L][D][I] (I contiguous)
  __nv_bfloat16* y_out = nullptr;            // [buffer rows][D]
  int num_ctas = 0;                          // persistent CTAs; 0 = one per SM
  uint32_t* tile_queue = nullptr;           // kTileQueueWords words, or nullptr (see above)
};

// Argument rules (both): D and I positive multiples of 64; num_experts >= 1; row_capacity >= 0
// and a multiple of 128 (0: nothing to do, nothing is launched); a window and ring as
// caracal/schedule_view.hpp says; expert_offset non-null; every
// matrix pointer non-null and 16-byte aligned (the TMA needs it); num_ctas >= 0.
void grouped_up_gate_swiglu(const UpGateSwigluArgs& args, cudaStream_t stream);
void grouped_down_proj(const DownProjArgs& args, cudaStream_t stream);

}  // namespace caracal::gemm
