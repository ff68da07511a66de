#pragma once
// How caracal_transfer_bench counts bytes. Every figure is bytes moved, read + write, of token-row
// payload (a row is D bf16 = 2*D bytes); schedule entries, expert ids, gates and dL/dg scalars
// (4 to 8 bytes per row) are left out. Per pass, summed over all ranks:
//   dispatch          reads each token's x row at its home rank once per rank holding experts of
//                     it (DESIGN §2: one read per (token, rank); one per route with
//                     ExchangeOptions::rows_per_route), writes it into each of its routes' rows of
//                     expert_x and writes the zero padding rows:      (pulled + padded_rows) * row
//   combine           push: reads each routed expert_out row and writes one sum per (token, rank)
//                     into a home slot (src/device/transfer/group_sum.cuh; one per route with
//                     rows_per_route); sum: reads every filled slot and writes one y row per token:
//                                                             (routed + 2 * pulled + tokens) * row
//   reverse_combine   as dispatch, with dy rows                       (pulled + padded_rows) * row
//   reverse_dispatch  push: reads each routed expert_dx row and writes it into its home slot;
//                     sum: reads every routed slot and writes one dx row per token:
//                                                                     (3 * routed + tokens) * row
// with routed = routes to a real expert, pulled = (token, rank) pairs (routed per route),
// padded_rows = the schedules' rows (routed + padding) and tokens = W * T. In a world of one rank
// (TokenExchange runs its transfers by token there) the pulls read a token once whatever
// rows_per_route says, and combine and reverse dispatch run in one pass, with no slot rows:
// each reads every routed row and writes one row per token:                (routed + tokens) * row
// The device-to-device copy a pass is compared with moves the same total: one cudaMemcpyAsync of
// half as many bytes, each read once and written once.
// In loopback every rank's traffic crosses one GPU's memory, so the rate is the whole GPU's. The
// counts are logical: a home row that several of its k routes read may come from L2, not HBM.
//
// NVLink bytes (the NCCL backend, one GPU per rank) count only the rows whose home rank (the
// token's) is not the rank holding their expert (expert e is on rank e / (E / W), the placement
// of schedule.hpp), each once, as one row arriving at the GPU it is written into:
//   dispatch, reverse_combine   the expert's rank pulls the token from the home rank once
//                               (remote_pulled_tokens; remote_pulled per route)
//   combine                     the expert's rank pushes one sum per token into a home slot
//                               (remote_pushed_tokens; remote_pushed per route)
//   reverse_dispatch            the expert's rank pushes each row into its home slot (remote_pushed)
// Padding rows, the slot sums and rows whose expert is on their home rank never leave their GPU.
#include <cstdint>
#include <vector>

#include "caracal/routing.hpp"
#include "caracal/transfer/exchange_shape.hpp"

namespace caracal::bench {

enum class Pass { kDispatch, kCombine, kReverseCombine, kReverseDispatch };

inline const char* name_of(Pass pass) {
  switch (pass) {
    case Pass::kDispatch:
      return "dispatch";
    case Pass::kCombine:
      return "combine";
    case Pass::kReverseCombine:
      return "reverse_combine";
    case Pass::kReverseDispatch:
      return "reverse_dispatch";
  }
  return "?";
}

inline bool is_pull(Pass pass) { return pass == Pass::kDispatch || pass == Pass::kReverseCombine; }

// The rows one exchange moves, over all ranks, and per rank those that cross between ranks.
struct RowTraffic {
  bool rows_per_route = false;  // ExchangeOptions::rows_per_route: pulls and combine move a row per route
  bool single_rank = false;     // a world of one rank: every transfer by token, in one pass
  int64_t routed = 0;       // routes to a real expert
  int64_t pulled_tokens = 0;  // (token, rank holding one of its experts) pairs
  int64_t padded_rows = 0;  // schedule rows: routed + padding to tile_m per expert
  int64_t tokens = 0;       // W * T
  int64_t row_bytes = 0;    // 2 * D
  std::vector<int64_t> remote_pulled;  // [W] rows rank r's experts take from other home ranks
  std::vector<int64_t> remote_pulled_tokens;  // [W] tokens of other home ranks rank r's experts take
  std::vector<int64_t> remote_pushed;  // [W] rows of rank r's tokens whose expert is on another rank
  std::vector<int64_t> remote_pushed_tokens;  // [W] (token of rank r, other rank holding its experts) pairs
};

// Rows each receiving rank's schedule holds: its experts' routes, each expert padded to tile_m.
std::vector<int64_t> schedule_rows_per_rank(const Routing& routing, int64_t num_experts, int64_t tile_m);

// Every count above from the routing; `rows_per_rank` from schedule_rows_per_rank.
RowTraffic traffic_of(const Routing& routing, const transfer::ExchangeShape& shape,
                      const std::vector<int64_t>& rows_per_rank, bool rows_per_route);

inline double bytes_moved(Pass pass, const RowTraffic& t) {
  // Rows read or pushed home per token.
  const int64_t per_token = t.rows_per_route && !t.single_rank ? t.routed : t.pulled_tokens;
  const int64_t rows = is_pull(pass)               ? per_token + t.padded_rows
                       : t.single_rank             ? t.routed + t.tokens
                       : pass == Pass::kCombine    ? t.routed + 2 * per_token + t.tokens
                                                   : 3 * t.routed + t.tokens;
  return static_cast<double>(rows) * static_cast<double>(t.row_bytes);
}

// [W] the NVLink bytes arriving at each rank's GPU in `pass`.
std::vector<double> remote_bytes_per_rank(Pass pass, const RowTraffic& t);

}  // namespace caracal::bench
