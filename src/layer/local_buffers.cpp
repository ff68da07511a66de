#include "layer/local_buffers.hpp"

#include <cuda_runtime.h>

#include <algorithm>

#include "caracal/comm/cuda_check.hpp"
#include "caracal/error.hpp"
#include "caracal/gemm/grouped_gemm.hpp"
#include "caracal/gemm/grouped_gemm_backward.hpp"
#include "caracal/gemm/grouped_gemm_backward_fp8.hpp"
#include "fused/fused_backward.hpp"
#include "fused/fused_forward.hpp"
#include "layer/fp8_weights.hpp"

namespace caracal::layer {

namespace {

// Carves one block into 256-byte aligned buffers in a fixed order; without a base it only adds up
// the bytes (local_bytes), so the size and the layout cannot disagree.
class BlockLayout {
 public:
  explicit BlockLayout(char* base) : base_(base) {}

  template <typename T>
  T* take(int64_t count) {
    constexpr size_t kAlignment = 256;
    const size_t offset = bytes_;
    bytes_ += (static_cast<size_t>(count) * sizeof(T) + kAlignment - 1) / kAlignment * kAlignment;
    return base_ != nullptr ? reinterpret_cast<T*>(base_ + offset) : nullptr;
  }
  // `rows` rows of `row_bytes` each (a RowFormat's), as elements of T.
  template <typename T>
  T* take_rows(int64_t rows, int64_t row_bytes) {
    return take<T>(rows * row_bytes / static_cast<int64_t>(sizeof(T)));
  }
  size_t bytes() const { return bytes_; }

 private:
  char* base_;
  size_t bytes_ = 0;
};

LocalBuffers lay_out(BlockLayout& block, const LayerSizes& s) {
  using bf16 = __nv_bfloat16;
  const int64_t rows = s.ring_rows;
  const int64_t I = s.intermediate;
  const int64_t D = s.hidden;
  LocalBuffers b;
  b.gate_up = block.take<bf16>(rows * 2 * I);
  b.activation = block.take_rows<LayerRow>(rows, s.rows.row_bytes(I));
  if (s.weight_grad_partials) {
    const auto partial = static_cast<int64_t>(gemm::weight_grad_partial_floats(s.hidden, s.intermediate));
    b.weight_grad_partials[0] = block.take<float>(partial);
    b.weight_grad_partials[1] = block.take<float>(partial);
  }
  const size_t workspace = s.fp8 ? gemm::fp8_down_dgrad_workspace_floats(s.routed_rows, s.intermediate)
                                 : gemm::down_dgrad_workspace_floats(s.routed_rows, s.intermediate);
  b.workspace = block.take<float>(static_cast<int64_t>(workspace));
  if (s.fp8) {
    const auto scaled_rows = [&](int64_t cols) {
      return gemm::Fp8RowOutput{block.take<__nv_fp8_e4m3>(rows * cols), block.take<float>(cols / 128 * rows)};
    };
    b.activation_fp8 = scaled_rows(I);
    b.dy_fp8 = scaled_rows(D);
    b.d_gate_up_fp8 = scaled_rows(2 * I);
    b.weights_fp8 = block.take<uint8_t>(static_cast<int64_t>(fp8_layer_weight_bytes(s)));
  }
  // The fused forward's counters and task slots, and between forwards the fused backward's (in FP8
  // over every row).
  const int shared_rows = s.has_shared ? s.shared_rows : 0;
  const int d = static_cast<int>(D), i = static_cast<int>(I);
  const size_t forward_words = s.fp8 ? fused::fp8_ready_counter_words(s.routed_rows, shared_rows, d, i)
                                     : fused::ready_counter_words(s.routed_rows, shared_rows);
  const size_t counters =
      std::max({forward_words, fused::backward_ready_counter_words(static_cast<int>(s.ring_rows), shared_rows),
                s.fp8 ? fused::backward_fp8_ready_counter_words(s.routed_rows, shared_rows) : size_t(0)});
  b.ready_counters = block.take<uint32_t>(static_cast<int64_t>(counters));
  b.tile_queue = block.take<uint32_t>(gemm::kTileQueueWords);
  if (!s.has_shared) return b;
  const int64_t shared = s.shared_rows;
  const int64_t Is = s.shared_intermediate;
  b.shared_offset = block.take<int32_t>(2);
  b.shared_count = block.take<int32_t>(1);
  if (!s.shared_rows_in_place()) {  // zero-padded copies of the exchange's rows
    b.shared_x = block.take_rows<LayerRow>(shared, s.rows.row_bytes(D));
    b.shared_out = block.take<bf16>(shared * D);
    b.shared_dy = block.take_rows<LayerRow>(shared, s.rows.row_bytes(D));
  }
  b.shared_gate_up = block.take<bf16>(shared * 2 * Is);
  b.shared_activation = block.take_rows<LayerRow>(shared, s.rows.row_bytes(Is));
  b.shared_gates = block.take<float>(shared);
  b.shared_dg = block.take<float>(shared);
  b.shared_workspace = block.take<float>(static_cast<int64_t>(
      s.fp8 ? gemm::fp8_down_dgrad_workspace_floats(s.shared_rows, s.shared_intermediate)
            : gemm::down_dgrad_workspace_floats(s.shared_rows, s.shared_intermediate)));
  if (s.fp8) {
    const auto scaled_rows = [&](int64_t cols) {
      return gemm::Fp8RowOutput{block.take<__nv_fp8_e4m3>(shared * cols), block.take<float>(cols / 128 * shared)};
    };
    b.shared_x_fp8 = scaled_rows(D);
    b.shared_activation_fp8 = scaled_rows(Is);
    b.shared_dy_fp8 = scaled_rows(D);
    b.shared_d_gate_up_fp8 = scaled_rows(2 * Is);
  }
  return b;
}

}  // namespace

size_t local_bytes(const LayerSizes& sizes) {
  BlockLayout block(nullptr);
  (void)lay_out(block, sizes);
  return block.bytes();
}

LocalMemory::LocalMemory(const LayerSizes& sizes, const DeviceAllocator& allocator) {
  const size_t bytes = local_bytes(sizes);
  block_ = comm::allocate_device_block(bytes, allocator, "MoELayer: local buffers");
  BlockLayout block(block_.get());
  buffers_ = lay_out(block, sizes);
  check_cuda(cudaMemset(block_.get(), 0, bytes), "MoELayer: cudaMemset(local buffers)");
  if (sizes.has_shared) {
    const int32_t offset[2] = {0, sizes.shared_rows};
    const int32_t count = sizes.tokens;
    check_cuda(cudaMemcpy(buffers_.shared_offset, offset, sizeof(offset), cudaMemcpyHostToDevice),
               "MoELayer: cudaMemcpy(shared expert offsets)");
    check_cuda(cudaMemcpy(buffers_.shared_count, &count, sizeof(count), cudaMemcpyHostToDevice),
               "MoELayer: cudaMemcpy(shared expert count)");
  }
  check_cuda(cudaDeviceSynchronize(), "MoELayer: cudaDeviceSynchronize(local buffers)");
}

}  // namespace caracal::layer
