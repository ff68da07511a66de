// NcclBaselineExchange: sort, count all-to-all, host sync, grouped send/recv, reorder (see the header).
#include <algorithm>
#include <cub/device/device_radix_sort.cuh>

#include "caracal/comm/cuda_check.hpp"
#include "caracal/error.hpp"
#include "device/transfer/row_copy.cuh"
#include "caracal/comm/nccl_check.hpp"
#include "nccl_baseline_exchange.hpp"

namespace caracal::bench {
namespace {

using transfer::kBf16PerVector;
using transfer::kWarpSize;
using transfer::row_vectors;

constexpr int kThreads = 256;
constexpr int kWarpsPerCta = kThreads / kWarpSize;
// Enough warps in flight for the row copies to reach full bandwidth; as a launch bound it also gives
// ptxas 64 registers, without which it squeezes the row loops into fewer and spills.
constexpr int kCtasPerSm = 4;
constexpr int kSlotsInFlight = 8;  // slot rows loaded before they are summed (all of them for k <= 8)

__device__ __forceinline__ int warp_index() {
  return static_cast<int>(blockIdx.x) * kWarpsPerCta + static_cast<int>(threadIdx.x) / kWarpSize;
}
__device__ __forceinline__ int warp_count() { return static_cast<int>(gridDim.x) * kWarpsPerCta; }

// Sort keys: the destination expert, or E for an empty slot (sorted last, never sent).
__global__ void route_keys_kernel(const int32_t* topk_idx, int routes, int num_experts, uint32_t* keys,
                                  int32_t* route_ids) {
  for (int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x); i < routes;
       i += static_cast<int>(gridDim.x * blockDim.x)) {
    const int32_t id = topk_idx[i];
    keys[i] = id >= 0 && id < num_experts ? static_cast<uint32_t>(id) : static_cast<uint32_t>(num_experts);
    route_ids[i] = i;
  }
}

// counts[e] = routes to expert e, from where each expert's run of sorted keys begins. One CTA:
// begin[e] = first i with key[i] >= e, written by the one i with key[i-1] < e <= key[i].
__global__ void expert_counts_kernel(const uint32_t* sorted_keys, int routes, int num_experts, int32_t* counts) {
  extern __shared__ int begin[];  // [E + 1]
  for (int i = static_cast<int>(threadIdx.x); i <= routes; i += static_cast<int>(blockDim.x)) {
    const int lo = i == 0 ? 0 : static_cast<int>(sorted_keys[i - 1]) + 1;
    const int hi = i == routes ? num_experts : static_cast<int>(sorted_keys[i]);
    for (int e = lo; e <= hi; ++e) begin[e] = i;
  }
  __syncthreads();
  for (int e = static_cast<int>(threadIdx.x); e < num_experts; e += static_cast<int>(blockDim.x)) {
    counts[e] = begin[e + 1] - begin[e];
  }
}

// send_rows[i] = x row of the i-th sorted route; slot_row[route] = i, or -1 for an empty slot.
// One warp per sorted route.
__global__ void __launch_bounds__(kThreads, kCtasPerSm)
    gather_send_rows_kernel(const __nv_bfloat16* x, const uint32_t* sorted_keys, const int32_t* sorted_routes,
                            int routes, int num_experts, int top_k, int hidden, __nv_bfloat16* send_rows,
                            int32_t* slot_row) {
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  for (int i = warp_index(); i < routes; i += warp_count()) {
    const int route = sorted_routes[i];
    const bool routed = sorted_keys[i] < static_cast<uint32_t>(num_experts);
    if (lane == 0) slot_row[route] = routed ? i : -1;
    if (routed) {
      transfer::warp_copy_row(row_vectors(send_rows, i, hidden), row_vectors(x, route / top_k, hidden),
                              hidden / kBf16PerVector, lane);
    }
  }
}

// Moves `rows` rows between the received layout and the expert-major one, segment by segment
// (table layout: NcclBaselineExchange::segments_). One warp per received-layout row.
__global__ void __launch_bounds__(kThreads, kCtasPerSm)
    reorder_rows_kernel(const __nv_bfloat16* src, __nv_bfloat16* dst, const int32_t* segments, int segment_count,
                        int rows, int hidden, bool to_expert_major) {
  extern __shared__ int32_t table[];  // [2 * segment_count + 1]
  for (int i = static_cast<int>(threadIdx.x); i < 2 * segment_count + 1; i += static_cast<int>(blockDim.x)) {
    table[i] = segments[i];
  }
  __syncthreads();
  const int32_t* received_start = table;
  const int32_t* expert_start = table + segment_count + 1;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  for (int r = warp_index(); r < rows; r += warp_count()) {
    // The last segment starting at or before r: empty segments share their start with the next one.
    int lo = 0;
    int hi = segment_count;
    while (hi - lo > 1) {
      const int mid = (lo + hi) / 2;
      if (received_start[mid] <= r) {
        lo = mid;
      } else {
        hi = mid;
      }
    }
    const int expert_row = expert_start[lo] + (r - received_start[lo]);
    const int from = to_expert_major ? r : expert_row;
    const int to = to_expert_major ? expert_row : r;
    transfer::warp_copy_row(row_vectors(dst, to, hidden), row_vectors(src, from, hidden), hidden / kBf16PerVector,
                            lane);
  }
}

// y[t] = sum over routed slots s in slot order of g * rows[slot_row[t*k + s]], fp32 fmaf from zero,
// rounded once. One warp per token, lanes over 16-byte vectors.
__global__ void __launch_bounds__(kThreads, kCtasPerSm)
    weighted_slot_sum_kernel(const __nv_bfloat16* rows, const int32_t* slot_row, const float* gates, int tokens,
                             int top_k, int hidden, __nv_bfloat16* y) {
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int vectors = hidden / kBf16PerVector;
  for (int t = warp_index(); t < tokens; t += warp_count()) {
    const int64_t first_route = static_cast<int64_t>(t) * top_k;
    for (int v = lane; v < vectors; v += kWarpSize) {
      float acc[kBf16PerVector] = {};
      for (int first = 0; first < top_k; first += kSlotsInFlight) {
        int row[kSlotsInFlight];
        uint4 value[kSlotsInFlight];
#pragma unroll
        for (int u = 0; u < kSlotsInFlight; ++u) {
          row[u] = first + u < top_k ? __ldg(slot_row + first_route + first + u) : -1;
          value[u] = row[u] >= 0 ? transfer::load_immutable16(row_vectors(rows, row[u], hidden) + v)
                                 : make_uint4(0u, 0u, 0u, 0u);
        }
#pragma unroll
        for (int u = 0; u < kSlotsInFlight; ++u) {
          if (row[u] < 0) continue;
          const float g = __ldg(gates + first_route + first + u);
          float x[kBf16PerVector];
          transfer::unpack_bf16x8(value[u], x);
#pragma unroll
          for (int i = 0; i < kBf16PerVector; ++i) acc[i] = __fmaf_rn(g, x[i], acc[i]);
        }
      }
      transfer::store16(row_vectors(y, t, hidden) + v, transfer::pack_bf16x8(acc));
    }
  }
}

int bit_width(int value) {
  int bits = 0;
  while (value >> bits) ++bits;
  return std::max(bits, 1);
}

}  // namespace

NcclBaselineExchange::NcclBaselineExchange(ncclComm_t comm, const transfer::ExchangeShape& shape) : comm_(comm) {
  CARACAL_CHECK(comm != nullptr, "NcclBaselineExchange: comm must not be null");
  comm::check_nccl(ncclCommCount(comm, &world_), "ncclCommCount", comm);
  comm::check_nccl(ncclCommCuDevice(comm, &device_), "ncclCommCuDevice", comm);
  const transfer::ExchangeSizes sizes = transfer::exchange_sizes(shape, world_);  // validates the shape
  tokens_ = static_cast<int>(shape.tokens);
  top_k_ = static_cast<int>(shape.top_k);
  hidden_ = static_cast<int>(shape.hidden);
  num_experts_ = static_cast<int>(shape.num_experts);
  local_experts_ = static_cast<int>(sizes.local_experts);
  routes_ = static_cast<int>(sizes.routes);
  check_cuda(cudaSetDevice(device_), "cudaSetDevice");
  check_cuda(cudaDeviceGetAttribute(&multiprocessors_, cudaDevAttrMultiProcessorCount, device_),
             "cudaDeviceGetAttribute(cudaDevAttrMultiProcessorCount)");

  const size_t routes = static_cast<size_t>(routes_);
  const size_t row = static_cast<size_t>(hidden_);
  const size_t most_rows = static_cast<size_t>(world_) * routes;
  const size_t segments = static_cast<size_t>(world_) * static_cast<size_t>(local_experts_);
  keys_ = comm::device_alloc<uint32_t>(routes, "cudaMalloc(baseline keys)");
  sorted_keys_ = comm::device_alloc<uint32_t>(routes, "cudaMalloc(baseline sorted keys)");
  route_ids_ = comm::device_alloc<int32_t>(routes, "cudaMalloc(baseline route ids)");
  sorted_routes_ = comm::device_alloc<int32_t>(routes, "cudaMalloc(baseline sorted routes)");
  sort_end_bit_ = bit_width(num_experts_);  // keys lie in [0, E]
  check_cuda(cub::DeviceRadixSort::SortPairs(nullptr, sort_workspace_bytes_, keys_.get(), sorted_keys_.get(),
                                             route_ids_.get(), sorted_routes_.get(), routes_, 0, sort_end_bit_),
             "cub::DeviceRadixSort::SortPairs (workspace size)");
  sort_workspace_ = comm::device_alloc<char>(std::max<size_t>(sort_workspace_bytes_, 1), "cudaMalloc(baseline sort)");
  counts_ = comm::device_alloc<int32_t>(static_cast<size_t>(num_experts_) + segments, "cudaMalloc(baseline counts)");
  counts_host_ = comm::pinned_mapped_alloc<int32_t>(static_cast<size_t>(num_experts_) + segments,
                                                    "cudaHostAlloc(baseline counts)");
  segments_ = comm::device_alloc<int32_t>(2 * segments + 1, "cudaMalloc(baseline reorder table)");
  segments_host_ = comm::pinned_mapped_alloc<int32_t>(2 * segments + 1, "cudaHostAlloc(baseline reorder table)");
  slot_row_ = comm::device_alloc<int32_t>(routes, "cudaMalloc(baseline slot rows)");
  send_rows_ = comm::device_alloc<__nv_bfloat16>(routes * row, "cudaMalloc(baseline send rows)");
  recv_rows_ = comm::device_alloc<__nv_bfloat16>(most_rows * row, "cudaMalloc(baseline received rows)");
  expert_x_ = comm::device_alloc<__nv_bfloat16>(most_rows * row, "cudaMalloc(baseline expert rows)");
}

void NcclBaselineExchange::dispatch(const int32_t* topk_idx, const __nv_bfloat16* x, cudaStream_t stream) {
  const int grid = std::min((routes_ + kWarpsPerCta - 1) / kWarpsPerCta, multiprocessors_ * kCtasPerSm);
  route_keys_kernel<<<grid, kThreads, 0, stream>>>(topk_idx, routes_, num_experts_, keys_.get(), route_ids_.get());
  check_cuda(cudaGetLastError(), "route_keys_kernel launch");
  check_cuda(
      cub::DeviceRadixSort::SortPairs(sort_workspace_.get(), sort_workspace_bytes_, keys_.get(), sorted_keys_.get(),
                                      route_ids_.get(), sorted_routes_.get(), routes_, 0, sort_end_bit_, stream),
      "cub::DeviceRadixSort::SortPairs");
  expert_counts_kernel<<<1, 1024, (static_cast<size_t>(num_experts_) + 1) * sizeof(int), stream>>>(
      sorted_keys_.get(), routes_, num_experts_, counts_.get());
  check_cuda(cudaGetLastError(), "expert_counts_kernel launch");
  gather_send_rows_kernel<<<grid, kThreads, 0, stream>>>(x, sorted_keys_.get(), sorted_routes_.get(), routes_,
                                                         num_experts_, top_k_, hidden_, send_rows_.get(),
                                                         slot_row_.get());
  check_cuda(cudaGetLastError(), "gather_send_rows_kernel launch");
  exchange_counts(stream);
  learn_counts_on_host(stream);
  exchange_rows(send_rows_.get(), send_count_, send_offset_, recv_rows_.get(), recv_count_, recv_offset_, stream);
  reorder(recv_rows_.get(), expert_x_.get(), true, stream);
}

void NcclBaselineExchange::combine(const __nv_bfloat16* expert_out, const float* gates, __nv_bfloat16* y,
                                   cudaStream_t stream) {
  CARACAL_CHECK(!send_count_.empty(), "NcclBaselineExchange::combine needs a dispatch first");
  reorder(expert_out, recv_rows_.get(), false, stream);
  // Every row goes back to where it came from: the dispatch's counts with the roles swapped.
  exchange_rows(recv_rows_.get(), recv_count_, recv_offset_, send_rows_.get(), send_count_, send_offset_, stream);
  const int grid = std::min((tokens_ + kWarpsPerCta - 1) / kWarpsPerCta, multiprocessors_ * kCtasPerSm);
  weighted_slot_sum_kernel<<<grid, kThreads, 0, stream>>>(send_rows_.get(), slot_row_.get(), gates, tokens_, top_k_,
                                                          hidden_, y);
  check_cuda(cudaGetLastError(), "weighted_slot_sum_kernel launch");
}

void NcclBaselineExchange::exchange_counts(cudaStream_t stream) {
  const size_t L = static_cast<size_t>(local_experts_);
  comm::check_nccl(ncclGroupStart(), "ncclGroupStart", comm_);
  for (int p = 0; p < world_; ++p) {
    const size_t at = static_cast<size_t>(p) * L;
    comm::check_nccl(ncclSend(counts_.get() + at, L, ncclInt32, p, comm_, stream), "ncclSend(counts)", comm_);
    comm::check_nccl(ncclRecv(counts_.get() + num_experts_ + at, L, ncclInt32, p, comm_, stream), "ncclRecv(counts)",
                     comm_);
  }
  comm::check_nccl(ncclGroupEnd(), "ncclGroupEnd(counts)", comm_);
}

void NcclBaselineExchange::learn_counts_on_host(cudaStream_t stream) {
  const int L = local_experts_;
  const int segments = world_ * L;
  check_cuda(
      cudaMemcpyAsync(counts_host_.get(), counts_.get(), static_cast<size_t>(num_experts_ + segments) * sizeof(int32_t),
                      cudaMemcpyDeviceToHost, stream),
      "cudaMemcpyAsync(baseline counts to host)");
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize(baseline counts)");
  const int32_t* sent = counts_host_.get();                     // [W][L]: to rank p's expert l
  const int32_t* received = counts_host_.get() + num_experts_;  // [W][L]: from rank p for local expert l
  const size_t W = static_cast<size_t>(world_);
  send_count_.assign(W, 0);
  recv_count_.assign(W, 0);
  expert_rows_.assign(static_cast<size_t>(L), 0);
  for (int p = 0; p < world_; ++p) {
    for (int l = 0; l < L; ++l) {
      send_count_[static_cast<size_t>(p)] += sent[p * L + l];
      recv_count_[static_cast<size_t>(p)] += received[p * L + l];
      expert_rows_[static_cast<size_t>(l)] += received[p * L + l];
    }
  }
  send_offset_.assign(W, 0);
  recv_offset_.assign(W, 0);
  for (size_t p = 1; p < W; ++p) {
    send_offset_[p] = send_offset_[p - 1] + send_count_[p - 1];
    recv_offset_[p] = recv_offset_[p - 1] + recv_count_[p - 1];
  }
  // The reorder table: segment (p, l) in the received layout (source-major) and expert-major.
  int32_t* received_start = segments_host_.get();
  int32_t* expert_start = segments_host_.get() + segments + 1;
  int32_t at = 0;
  for (int s = 0; s < segments; ++s) {
    received_start[s] = at;
    at += received[s];
  }
  received_start[segments] = at;
  received_rows_ = at;
  at = 0;
  for (int l = 0; l < L; ++l) {
    for (int p = 0; p < world_; ++p) {
      expert_start[p * L + l] = at;
      at += received[p * L + l];
    }
  }
  check_cuda(cudaMemcpyAsync(segments_.get(), segments_host_.get(),
                             static_cast<size_t>(2 * segments + 1) * sizeof(int32_t), cudaMemcpyHostToDevice, stream),
             "cudaMemcpyAsync(baseline reorder table)");
}

void NcclBaselineExchange::exchange_rows(const __nv_bfloat16* send, const std::vector<int64_t>& send_count,
                                         const std::vector<int64_t>& send_offset, __nv_bfloat16* recv,
                                         const std::vector<int64_t>& recv_count,
                                         const std::vector<int64_t>& recv_offset, cudaStream_t stream) {
  const size_t row = static_cast<size_t>(hidden_);
  comm::check_nccl(ncclGroupStart(), "ncclGroupStart", comm_);
  for (int p = 0; p < world_; ++p) {
    const size_t i = static_cast<size_t>(p);
    comm::check_nccl(ncclSend(send + static_cast<size_t>(send_offset[i]) * row,
                              static_cast<size_t>(send_count[i]) * row, ncclBfloat16, p, comm_, stream),
                     "ncclSend(rows)", comm_);
    comm::check_nccl(ncclRecv(recv + static_cast<size_t>(recv_offset[i]) * row,
                              static_cast<size_t>(recv_count[i]) * row, ncclBfloat16, p, comm_, stream),
                     "ncclRecv(rows)", comm_);
  }
  comm::check_nccl(ncclGroupEnd(), "ncclGroupEnd(rows)", comm_);
}

void NcclBaselineExchange::reorder(const __nv_bfloat16* src, __nv_bfloat16* dst, bool to_expert_major,
                                   cudaStream_t stream) {
  if (received_rows_ == 0) return;
  const int rows = static_cast<int>(received_rows_);
  const int segments = world_ * local_experts_;
  const int grid = std::min((rows + kWarpsPerCta - 1) / kWarpsPerCta, multiprocessors_ * kCtasPerSm);
  const size_t table_bytes = static_cast<size_t>(2 * segments + 1) * sizeof(int32_t);
  reorder_rows_kernel<<<grid, kThreads, table_bytes, stream>>>(src, dst, segments_.get(), segments, rows, hidden_,
                                                               to_expert_major);
  check_cuda(cudaGetLastError(), "reorder_rows_kernel launch");
}

}  // namespace caracal::bench
