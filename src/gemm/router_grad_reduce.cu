// The router-score gradient's cross-tile reduction (router_grad_reduce.hpp): one thread per row,
// partials added in N-tile order, so the result does not depend on the grid or on the order in
// which the dgrad tiles ran. A plain kernel, no CuTe.
#include "gemm/router_grad_reduce.hpp"

#include <algorithm>

#include "caracal/error.hpp"

namespace caracal::gemm {
namespace {

__global__ void reduce_router_grad_kernel(const float* partials, int n_blocks,
                                          const int32_t* expert_offset, int num_experts,
                                          int first_row, int end_row, float* dg) {
  int const rows = min(__ldg(expert_offset + num_experts), end_row);
  for (int r = first_row + int(blockIdx.x * blockDim.x + threadIdx.x); r < rows;
       r += int(gridDim.x * blockDim.x)) {
    const float* row = partials + int64_t(r) * n_blocks;
    float sum = 0.0f;
    for (int n = 0; n < n_blocks; ++n) sum += row[n];
    dg[r] = sum;
  }
}

}  // namespace

void reduce_router_grad(const float* partials, int n_blocks, const ScheduleView& rows, float* dg,
                        cudaStream_t stream, const char* fn) {
  constexpr int kThreads = 256;
  int const end_row = rows.end_row > 0 ? rows.end_row : rows.row_capacity;
  int const blocks = std::max(1, std::min((end_row - rows.first_row + kThreads - 1) / kThreads, 4096));
  reduce_router_grad_kernel<<<blocks, kThreads, 0, stream>>>(partials, n_blocks, rows.expert_offset,
                                                             rows.num_experts, rows.first_row, end_row, dg);
  cudaError_t const err = cudaGetLastError();
  CARACAL_CHECK(err == cudaSuccess, fn, ": router-gradient reduction launch failed: ",
                cudaGetErrorString(err));
}

}  // namespace caracal::gemm
