#pragma once
// Host-side argument checks of the grouped-GEMM entry points. Each throws caracal::Error whose
// message names the function, the argument, the value expected and the value given; the checks
// touch no CUDA, so they run (and are tested) without a GPU. Below them, the launch sizing helpers.
#include <cuda_runtime.h>

#include <cstdint>

#include "caracal/gemm/grouped_gemm.hpp"
#include "caracal/gemm/grouped_gemm_backward.hpp"
#include "caracal/gemm/grouped_gemm_backward_fp8.hpp"
#include "caracal/gemm/grouped_gemm_fp8.hpp"

namespace caracal::gemm {

void check_up_gate_swiglu_args(const UpGateSwigluArgs& args);
void check_down_proj_args(const DownProjArgs& args);
void check_down_dgrad_swiglu_args(const DownDgradSwigluArgs& args);
// dx_stored false: the caller stores the dx rows elsewhere (their home slots), so dx_out may be null.
void check_gate_up_dgrad_args(const GateUpDgradArgs& args, bool dx_stored = true);
void check_weight_grads_args(const WeightGradArgs& args);
void check_up_gate_swiglu_args(const Fp8UpGateSwigluArgs& args);
void check_down_proj_args(const Fp8DownProjArgs& args);
void check_down_dgrad_swiglu_args(const Fp8DownDgradSwigluArgs& args);
// block_n: the N of the launch's tile (the standalone FP8 dx's 256; the fused FP8 backward's 128).
void check_gate_up_dgrad_args(const Fp8GateUpDgradArgs& args, bool dx_stored = true, int block_n = 256);
void check_weight_grads_args(const Fp8WeightGradArgs& args);

// Persistent grid size: num_ctas, or one CTA per SM of the current device when 0; never more
// than the tiles the row capacity can hold, never less than 1.
int persistent_grid_size(int num_ctas, int64_t max_tiles, const char* fn);

// The most clusters of two CTAs of `kernel` (threads and dynamic shared memory a CTA) the current
// device runs at once (paired_gemm_kernel.cuh): an SM a GPC cannot pair up stays out, so this may
// be less than half the SMs. Asked of CUDA once per kernel and device.
int max_active_pairs(const void* kernel, int threads, int smem_bytes, const char* fn);

// The launch attribute of clusters of two CTAs along x (the pairs' launch and its occupancy query).
cudaLaunchAttribute pair_cluster_attribute();

}  // namespace caracal::gemm
