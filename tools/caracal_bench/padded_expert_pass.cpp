#include "padded_expert_pass.hpp"

#include <cstddef>

#include "caracal/comm/cuda_check.hpp"
#include "caracal/error.hpp"
#include "caracal/gemm/grouped_gemm.hpp"
#include "caracal/gemm/grouped_gemm_backward.hpp"
#include "device_buffer.hpp"
#include "padded_rows.hpp"

namespace caracal::bench_tool {

namespace {

using bf16 = __nv_bfloat16;

}  // namespace

PaddedExpertPass::PaddedExpertPass(const std::vector<int64_t>& counts, int hidden, int intermediate, uint64_t seed,
                                   cudaStream_t stream)
    : counts_(counts), offsets_(bench::padded_offsets(counts)) {
  CARACAL_CHECK(!counts.empty(), "PaddedExpertPass: needs at least one expert");
  const size_t L = counts.size(), rows = size_t(offsets_.back()), D = size_t(hidden), I = size_t(intermediate);
  std::vector<int32_t> counts32(L);  // each count fits: it is at most the int32 padded total
  for (size_t e = 0; e < L; ++e) counts32[e] = static_cast<int32_t>(counts[e]);
  const std::vector<float> gates = bench::padded_row_gates(counts, seed);

  expert_offset_ = comm::device_alloc<int32_t>(L + 1, "cudaMalloc(baseline expert offsets)");
  expert_count_ = comm::device_alloc<int32_t>(L, "cudaMalloc(baseline expert counts)");
  x_ = device_buffer<bf16>(rows * D, "cudaMalloc(baseline expert x)");
  gate_up_ = device_buffer<bf16>(rows * 2 * I, "cudaMalloc(baseline gate_up)");
  hidden_act_ = device_buffer<bf16>(rows * I, "cudaMalloc(baseline hidden)");
  out_ = device_buffer<bf16>(rows * D, "cudaMalloc(baseline expert out)");
  dy_ = device_buffer<bf16>(rows * D, "cudaMalloc(baseline expert dy)");
  d_gate_up_ = device_buffer<bf16>(rows * 2 * I, "cudaMalloc(baseline d_gate_up)");
  dx_ = device_buffer<bf16>(rows * D, "cudaMalloc(baseline expert dx)");
  gates_ = device_buffer<float>(rows, "cudaMalloc(baseline expert gates)");
  dg_ = device_buffer<float>(rows, "cudaMalloc(baseline expert dg)");
  workspace_ = device_buffer<float>(gemm::down_dgrad_workspace_floats(static_cast<int>(rows), intermediate),
                                 "cudaMalloc(baseline dgrad workspace)");
  // The GEMMs at their best, as the layer runs them: row tiles from a tile queue.
  tile_queue_ = comm::device_alloc<uint32_t>(size_t(gemm::kTileQueueWords), "cudaMalloc(baseline tile queue)");

  check_cuda(cudaMemcpyAsync(expert_offset_.get(), offsets_.data(), (L + 1) * sizeof(int32_t), cudaMemcpyHostToDevice,
                             stream),
             "cudaMemcpyAsync(baseline expert offsets)");
  check_cuda(cudaMemcpyAsync(expert_count_.get(), counts32.data(), L * sizeof(int32_t), cudaMemcpyHostToDevice, stream),
             "cudaMemcpyAsync(baseline expert counts)");
  if (rows > 0) {
    check_cuda(cudaMemcpyAsync(gates_.get(), gates.data(), rows * sizeof(float), cudaMemcpyHostToDevice, stream),
               "cudaMemcpyAsync(baseline expert gates)");
  }
  check_cuda(cudaMemsetAsync(x_.get(), 0, rows * D * sizeof(bf16), stream), "cudaMemsetAsync(baseline expert x)");
  check_cuda(cudaMemsetAsync(dy_.get(), 0, rows * D * sizeof(bf16), stream), "cudaMemsetAsync(baseline expert dy)");
  check_cuda(cudaMemsetAsync(gate_up_.get(), 0, rows * 2 * I * sizeof(bf16), stream),
             "cudaMemsetAsync(baseline gate_up)");
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize(baseline expert rows)");  // the host sources

  // Every field of gemm::ExpertPass, in its order; num_ctas 0: one per SM, as MoELayer's default options.
  pass_ = {ScheduleView{expert_offset_.get(), expert_count_.get(), static_cast<int>(L), static_cast<int>(rows)},
           hidden,
           intermediate,
           /*num_ctas=*/0,
           tile_queue_.get(),
           x_.get(),
           gate_up_.get(),
           hidden_act_.get(),
           out_.get(),
           dy_.get(),
           gates_.get(),
           d_gate_up_.get(),
           dg_.get(),
           workspace_.get(),
           dx_.get()};
}

void PaddedExpertPass::load_x(const bf16* rows, cudaStream_t stream) { scatter(rows, x_.get(), stream); }

void PaddedExpertPass::load_dy(const bf16* rows, cudaStream_t stream) { scatter(rows, dy_.get(), stream); }

void PaddedExpertPass::scatter(const bf16* rows, bf16* padded, cudaStream_t stream) const {
  const size_t D = size_t(pass_.hidden);
  size_t from = 0;
  for (size_t e = 0; e < counts_.size(); ++e) {
    const size_t n = size_t(counts_[e]);
    if (n == 0) continue;
    check_cuda(cudaMemcpyAsync(padded + size_t(offsets_[e]) * D, rows + from * D, n * D * sizeof(bf16),
                               cudaMemcpyDeviceToDevice, stream),
               "cudaMemcpyAsync(baseline padded expert rows)");
    from += n;
  }
}

}  // namespace caracal::bench_tool
