#pragma once
// The Hopper grouped-GEMM engine, forward half: the routed experts' SwiGLU feed-forward over the
// expert-contiguous rows of one rank (DESIGN §2, §3); the backward half is grouped_gemm_backward.hpp.
// Rows: the rank's ScheduleView (caracal/schedule_view.hpp), its offsets and counts in device memory
// only (graph-capturable); the kernels work on its window [first_row, end_row) and never touch rows
// past row_capacity or expert_offset[L]. Padding rows must hold zeros on input; every row of an
// expert's 128-row blocks is written, padding with zeros, so outputs are a pure function of the
// real inputs. Bitwise deterministic across runs and num_ctas (one CTA a tile, a fixed K order).
// Row-tile kernels run CTAs in pairs (num_ctas rounded up to even; 0: as many pairs as fit).
// Arguments are checked on the host first (caracal::Error naming the argument and the value
// expected), then one kernel is enqueued on `stream`. sm_90a only; no CuTe in this header.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "caracal/gemm/gate_up_order.hpp"
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
  const __nv_bfloat16* w_gate_up = nullptr;  // [L][2I][D], its rows as w_gate_up_layout says
  GateUpLayout w_gate_up_layout = GateUpLayout::kInterleaved;
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
