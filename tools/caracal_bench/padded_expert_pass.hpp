#pragma once
// The row buffers of one gemm::ExpertPass (src/layer/expert_pass.hpp) over expert-contiguous rows
// padded to the grouped GEMMs' 128-row tile, filled from unpadded expert-major rows: what a
// framework hands the grouped GEMMs once its exchange has delivered the rows and the host knows the
// per-expert counts. caracal bench's NCCL baseline runs the layer's own expert_forward and
// expert_backward on it.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "caracal/comm/cuda_memory.hpp"
#include "caracal/gemm/expert_pass.hpp"

namespace caracal::bench_tool {

class PaddedExpertPass {
 public:
  // counts[e]: the real rows of expert e. Computes the padded offsets on the host and uploads them
  // with the counts, allocates every row buffer with zeros in x, dy and gate_up (the forward output
  // the backward reads), and gives each real row a gate in [0, 1) from `seed` (0 on padding rows).
  // Synchronizes `stream`. The current device must be the one the pass will run on.
  PaddedExpertPass(const std::vector<int64_t>& counts, int hidden, int intermediate, uint64_t seed,
                   cudaStream_t stream);

  // Copies rows [sum of counts][D], expert-major and unpadded (device memory), into x or dy at
  // their experts' offsets; padding rows stay zero. Enqueued on `stream`.
  void load_x(const __nv_bfloat16* rows, cudaStream_t stream);
  void load_dy(const __nv_bfloat16* rows, cudaStream_t stream);

  const gemm::ExpertPass& pass() const { return pass_; }

 private:
  void scatter(const __nv_bfloat16* rows, __nv_bfloat16* padded, cudaStream_t stream) const;

  std::vector<int64_t> counts_;
  std::vector<int32_t> offsets_;
  gemm::ExpertPass pass_;
  comm::DeviceMemory<int32_t> expert_offset_, expert_count_;
  comm::DeviceMemory<__nv_bfloat16> x_, gate_up_, hidden_act_, out_, dy_, d_gate_up_, dx_;
  comm::DeviceMemory<float> gates_, dg_, workspace_;
  comm::DeviceMemory<uint32_t> tile_queue_;
};

}  // namespace caracal::bench_tool
