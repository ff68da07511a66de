#pragma once
// The bf16 epilogues' parameters over a row buffer of `buffer_rows` rows (its maps' boxes are the
// epilogue's chunks), as the bf16 and FP8 launchers and the fused kernels build them.
#include <cuda_bf16.h>

#include <cstdint>

#include "device/gemm/bf16_epilogue.cuh"
#include "device/gemm/swiglu_epilogue.cuh"
#include "gemm/tensor_map.hpp"

namespace caracal::gemm {

// Rows stored as they are: out [buffer_rows][cols] (null: no map, for a caller that stores the rows
// elsewhere).
inline RowsBf16Epilogue::Params rows_epilogue_params(__nv_bfloat16* out, uint64_t buffer_rows, int cols,
                                                     const char* name) {
  RowsBf16Epilogue::Params e{};
  if (out != nullptr) e.out = make_tensor_map_2d(out, buffer_rows, uint64_t(cols), kChunkRows, kChunkCols, name);
  e.cols = cols;
  return e;
}

// The SwiGLU epilogue: activation_out [buffer_rows][I]; gate_up_out [buffer_rows][2I], or null (not
// stored).
inline UpGateSwigluEpilogue::Params swiglu_epilogue_params(__nv_bfloat16* activation_out, __nv_bfloat16* gate_up_out,
                                                           uint64_t buffer_rows, int intermediate) {
  const uint64_t i = uint64_t(intermediate);
  UpGateSwigluEpilogue::Params e{};
  e.activation = make_tensor_map_2d(activation_out, buffer_rows, i, kChunkRows, kChunkCols, "activation_out");
  e.store_gate_up = gate_up_out != nullptr;
  if (e.store_gate_up) e.gate_up = make_tensor_map_2d(gate_up_out, buffer_rows, 2 * i, kChunkRows, kChunkCols, "gate_up_out");
  e.intermediate = intermediate;
  return e;
}

}  // namespace caracal::gemm
