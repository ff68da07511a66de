#pragma once
// The per-rank buffers of a token exchange, all in the world's symmetric heap (the same offset on
// every rank), named by SymmetricPtr. Shapes use T tokens, k slots, D hidden, L local experts,
// W ranks, R = row_capacity rows (exchange_shape.hpp). Plain data: valid in host and device code.
//
// Who touches what (home = the rank that owns the tokens, expert side = the rank that owns the
// expert; a rank is both for different routes):
//   read by peers:    topk_idx, x, x_codes, x_scales, dy, dy_codes, dy_scales, gates
//   written by peers: route_location, combine_slots, dx_slots, dg_slots
//   everything else is local to its rank.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <vector_types.h>

#include <cstdint>

#include "caracal/comm/symmetric_ptr.hpp"
#include "caracal/precision_traits.hpp"

namespace caracal::transfer {

template <typename T>
using Sym = comm::SymmetricPtr<T>;

// The schedule table (DESIGN §2), built on the GPU by TokenExchange::build_schedule. What the
// kernels read of a rank's table is its ScheduleView (caracal/schedule_view.hpp).
struct ScheduleBuffers {
  Sym<int32_t> topk_idx;       // [T*k] input: global expert ids, -1 = empty slot
  Sym<int2> rows;              // [R] {src_rank, src_route = token*k + slot}; padding rows {-1, -1};
                               //     rows at and past expert_offset[L] are left untouched
  Sym<int32_t> expert_offset;  // [L+1] first row of each local expert's segment (multiples of tile_m)
  Sym<int32_t> expert_count;   // [L] routes per local expert
  Sym<int32_t> source_count;   // [L][W] routes per (local expert, source rank)
  Sym<int2> route_location;    // [T*k] inverse view: {dst_rank, row} processing each home route,
                               //     {-1, -1} for an empty slot
  Sym<int32_t> route_rows;     // [W][T*k] per route of each source: its row here, or -1 (the
                               //     builder's workspace first: the route's local expert, or -1);
                               //     the pulls find a token's rows here (token_group.cuh)
  Sym<int32_t> chunk_counts;   // workspace [W][chunks][L]: per (source, chunk, local expert), the routes
                               //     in the earlier chunks of the chunk's block
  Sym<int32_t> block_counts;   // workspace [W][blocks][L]: routes per (source, block, local expert),
                               //     then (build_schedule's scan) those in the source's earlier blocks
};

// Router weights on the home rank.
struct RouterBuffers {
  Sym<float> topk_scores;    // [T*k] input
  Sym<float> gates;          // [T*k] g (build_schedule); 0 for empty slots
  Sym<float> d_topk_scores;  // [T*k] output of reverse_dispatch; 0 for empty slots
};

// Rows of expert_x a dispatch may leave as they are, because an earlier launch put them there (the
// fused forward pulls the rows of tokens on other GPUs into its ring, or every row when asked to):
// none, the rows of tokens on other GPUs than this one, or every real row. Padding rows are always
// zeroed.
enum class RowsInPlace : int { kNone, kOtherGpus, kAll };

// x, expert_x, dy and expert_dy hold rows in the exchange's precision (ExchangeShape::precision,
// typed LayerRow: caracal/precision_traits.hpp); the other rows are bf16.
struct ForwardBuffers {
  Sym<LayerRow> x;                   // [T][D] input
  Sym<LayerRow> expert_x;            // [R or ring][D] dispatch output, schedule order; padding rows zero
  Sym<__nv_bfloat16> expert_out;     // [R][D] combine input: E_i(x) per row, unweighted
  Sym<__nv_bfloat16> combine_slots;  // [T*k][D] expert outputs as pushed to their home slots
  Sym<__nv_bfloat16> shared_out;     // [T][D] optional input: the shared expert's output
  Sym<__nv_bfloat16> y;              // [T][D] combine output
  // x in e4m3 with one fp32 scale per 1 x 128 block (ExchangeOptions::fp8_dispatch, else null):
  // [Th][D] and [D / 128][Th] input, Th = T rounded up to tile_m: x quantized at home in the FP8
  // GEMMs' layout (a rank's own GEMMs may read them too); rows past T are not pulled.
  Sym<__nv_fp8_e4m3> x_codes;
  Sym<float> x_scales;
  Sym<__nv_fp8_e4m3> expert_x_codes;  // [R][D] dispatch_fp8 output, schedule order; padding rows zero
  Sym<float> expert_x_scales;         // [D / 128][S] (the FP8 GEMMs' layout, S = the schedule view's
                                      // buffer rows); padding rows the scale of a zero block
};

struct BackwardBuffers {
  Sym<LayerRow> dy;              // [T][D] input
  Sym<LayerRow> expert_dy;       // [R or ring][D] reverse-combine output (g not applied); padding 0
  Sym<float> expert_gates;       // [R] g of each row's route; padding rows 0
  Sym<__nv_bfloat16> expert_dx;  // [R][D] reverse-dispatch input
  Sym<float> expert_dg;          // [R] reverse-dispatch input: dL/dg of each row's route
  Sym<__nv_bfloat16> dx_slots;   // [T*k][D] dx rows as pushed to their home slots: the forward's
                                 // combine_slots when both directions are allocated
  Sym<float> dg_slots;           // [T*k] dL/dg as pushed to their home slots
  Sym<__nv_bfloat16> shared_dx;  // [T][D] optional input: the shared expert's dx
  Sym<__nv_bfloat16> dx;         // [T][D] reverse-dispatch output
  // dy in e4m3 with one fp32 scale per 1 x 128 block (ExchangeOptions::fp8_reverse_combine, else
  // null), laid out as ForwardBuffers' x_codes ... expert_x_scales:
  Sym<__nv_fp8_e4m3> dy_codes;         // [Th][D] and [D / 128][Th] input (as x_codes, x_scales):
  Sym<float> dy_scales;                // dy quantized at home
  Sym<__nv_fp8_e4m3> expert_dy_codes;  // [R][D] reverse_combine_fp8 output; padding rows zero
  Sym<float> expert_dy_scales;         // [D / 128][S]; padding rows the scale of a zero block
};

}  // namespace caracal::transfer
