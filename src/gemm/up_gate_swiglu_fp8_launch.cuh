#pragma once
// The FP8 up/gate's launch parameters but the mainloop's, shared by its two units
// (up_gate_swiglu_fp8.cu: x's rows by TMA; up_gate_swiglu_fp8_gathered.cu: the tokens' rows gathered).
#include <cstdint>

#include "caracal/gemm/grouped_gemm_fp8.hpp"
#include "device/gemm/swiglu_fp8_epilogue.cuh"
#include "gemm/tensor_map.hpp"

namespace caracal::gemm {

// The epilogue's parameters for checked `args` with rows.
inline UpGateSwigluFp8Epilogue::Params up_gate_fp8_epilogue(const Fp8UpGateSwigluArgs& args) {
  const uint64_t rows = uint64_t(args.rows.buffer_rows());
  const uint64_t i = uint64_t(args.intermediate);
  UpGateSwigluFp8Epilogue::Params e{};
  e.swiglu.intermediate = args.intermediate;
  e.swiglu.store_gate_up = args.gate_up_out != nullptr;
  if (e.swiglu.store_gate_up) {
    e.swiglu.gate_up = make_tensor_map_2d(args.gate_up_out, rows, 2 * i, kChunkRows, kChunkCols, "gate_up_out");
  }
  e.store_activation = args.activation_out != nullptr;
  if (e.store_activation) {
    e.swiglu.activation = make_tensor_map_2d(args.activation_out, rows, i, kChunkRows, kChunkCols, "activation_out");
  }
  e.store_activation_codes = args.activation_fp8_out.codes != nullptr;
  if (e.store_activation_codes) {
    e.activation_codes = make_tensor_map_2d(args.activation_fp8_out.codes, rows, i, kChunkRows, kScaleBlock,
                                            "activation_fp8_out.codes", TensorElement::kE4m3);
    e.activation_scales = args.activation_fp8_out.scales;
  }
  e.buffer_rows = int(rows);
  return e;
}

// x_tokens' launch (up_gate_swiglu_fp8_gathered.cu), for checked `args` with rows.
void launch_up_gate_swiglu_fp8_gathered(const Fp8UpGateSwigluArgs& args, cudaStream_t stream);

}  // namespace caracal::gemm
