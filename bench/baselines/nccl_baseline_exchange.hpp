#pragma once
// The token exchange frameworks run today, as the baseline TokenExchange is measured against
// (issue 3): the host learns the counts. One rank per GPU over an NCCL communicator, made by
// either bootstrap of caracal/comm/nccl_bootstrap.hpp; every rank calls dispatch and combine at
// the same point. Buffers are sized for the worst case at construction (a rank may receive all
// W*T*k routes); nothing is allocated per call.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "caracal/comm/cuda_memory.hpp"
#include "caracal/transfer/exchange_shape.hpp"

namespace caracal::bench {

class NcclBaselineExchange {
 public:
  // `comm` (one rank of it, on its device, made current here) must outlive the exchange.
  // shape.tile_m is not used. Throws caracal::Error for an invalid shape or CUDA failures.
  NcclBaselineExchange(ncclComm_t comm, const transfer::ExchangeShape& shape);

  // topk_idx [T*k] (ids outside [0, E) are empty slots) and x [T][D], on this rank's device:
  //   1. local: stable sort of the T*k routes by destination expert (CUB radix sort, what
  //      torch.argsort does), so the routes bound for rank p's experts are contiguous; per-expert
  //      counts from the sorted keys; x rows gathered into that order (the send buffer);
  //   2. all-to-all of the per-expert counts: grouped ncclSend/ncclRecv of L ints per peer;
  //   3. the counts to pinned host memory, then cudaStreamSynchronize: the host learns how many
  //      rows it sends to and receives from every peer (the synchronization TokenExchange avoids);
  //   4. grouped ncclSend/ncclRecv of the rows; they arrive ordered [source rank][local expert][route];
  //   5. local: reordered expert-major, [local expert][source rank][route] (expert_x()), the layout
  //      a grouped GEMM needs.
  // Synchronizes `stream` once, half way (step 3). Collective.
  void dispatch(const int32_t* topk_idx, const __nv_bfloat16* x, cudaStream_t stream);

  // After dispatch: rows received per local expert, their sum, and the rows ([received_rows][D],
  // expert-major, valid once the stream reaches the end of dispatch). Against TokenExchange
  // (schedule.hpp): the j-th route (0-based, (token, slot) order) of source p to local expert l is
  // row  sum_{l'<l} n_l' + sum_{q<p} c_q + j  here (n_l: routes to l, c_q: routes of source q to l;
  // segments unpadded and back to back), and row
  //   expert_offset[l] + sum_q min(c_q, j) + #{q < p : c_q > j}  of TokenExchange's expert_x
  // (segments padded to tile_m, sources interleaved). At W = 1 both orders are (token, slot) order:
  // every expert's rows are equal row for row, TokenExchange's padding rows aside.
  const std::vector<int64_t>& expert_rows() const { return expert_rows_; }
  int64_t received_rows() const { return received_rows_; }
  const __nv_bfloat16* expert_x() const { return expert_x_.get(); }

  // expert_out [received_rows][D] in expert_x()'s order (may be expert_x() itself), gates [T*k]
  // (read for routed slots only), y [T][D]. The way back, with the counts already known:
  // expert-major -> source-major, grouped send/recv back to the home ranks, then
  // y[t] = sum over routed slots s, in slot order, of g[t*k+s] * row(t, s), in fp32 (fmaf from
  // zero) rounded once to bf16: TokenExchange::combine's operations without a shared expert, so y
  // is bit-identical to it. No host sync. Collective; needs a dispatch first.
  void combine(const __nv_bfloat16* expert_out, const float* gates, __nv_bfloat16* y, cudaStream_t stream);

 private:
  void exchange_counts(cudaStream_t stream);
  void learn_counts_on_host(cudaStream_t stream);
  void exchange_rows(const __nv_bfloat16* send, const std::vector<int64_t>& send_count,
                     const std::vector<int64_t>& send_offset, __nv_bfloat16* recv,
                     const std::vector<int64_t>& recv_count, const std::vector<int64_t>& recv_offset,
                     cudaStream_t stream);
  void reorder(const __nv_bfloat16* src, __nv_bfloat16* dst, bool to_expert_major, cudaStream_t stream);

  ncclComm_t comm_;
  int world_ = 1;
  int device_ = 0;
  int multiprocessors_ = 0;
  int tokens_, top_k_, hidden_, num_experts_, local_experts_;
  int routes_;  // T * k

  // Sort: keys (destination expert, E for empty) and route ids, in and sorted; CUB's workspace.
  comm::DeviceMemory<uint32_t> keys_, sorted_keys_;
  comm::DeviceMemory<int32_t> route_ids_, sorted_routes_;
  comm::DeviceMemory<char> sort_workspace_;
  size_t sort_workspace_bytes_ = 0;
  int sort_end_bit_ = 1;

  // counts_[0, E): routes per destination expert; counts_[E, E + W*L): routes per (source, local
  // expert) received in the all-to-all. Copied to counts_host_ in one go.
  comm::DeviceMemory<int32_t> counts_;
  comm::PinnedMemory<int32_t> counts_host_;
  // Reorder table, [2*W*L + 1] ints: segment (p, l) = p*L + l starts at table[s] in the received
  // layout (table[W*L] = rows received) and at table[W*L + 1 + s] in the expert-major layout.
  comm::DeviceMemory<int32_t> segments_;
  comm::PinnedMemory<int32_t> segments_host_;

  comm::DeviceMemory<int32_t> slot_row_;         // [T*k] row of each route in send_rows_, -1 if empty
  comm::DeviceMemory<__nv_bfloat16> send_rows_;  // [T*k][D] dispatch: sent; combine: received back
  comm::DeviceMemory<__nv_bfloat16> recv_rows_;  // [W*T*k][D] dispatch: received; combine: sent back
  comm::DeviceMemory<__nv_bfloat16> expert_x_;   // [W*T*k][D] expert-major

  // Host view of the last dispatch, per peer (rows) and per local expert.
  std::vector<int64_t> send_count_, send_offset_, recv_count_, recv_offset_, expert_rows_;
  int64_t received_rows_ = 0;
};

}  // namespace caracal::bench
