#pragma once
// How caracal_transfer_bench counts bytes. Every figure is bytes moved, read + write, of token-row
// payload (a row is D bf16 = 2*D bytes); schedule entries, expert ids, gates and dL/dg scalars
// (4 to 8 bytes per row) are left out. Per pass, summed over all ranks:
//   dispatch          reads each routed x row at its home rank and writes it into expert_x,
//                     and writes the zero padding rows:               (routed + padded_rows) * row
//   combine           push: reads each routed expert_out row and writes it into its home slot;
//                     sum: reads every routed slot and writes one y row per token:
//                                                                     (3 * routed + tokens) * row
//   reverse_combine   as dispatch, with dy rows                       (routed + padded_rows) * row
//   reverse_dispatch  as combine, with expert_dx rows                 (3 * routed + tokens) * row
// with routed = routes to a real expert, padded_rows = the schedules' rows (routed + padding) and
// tokens = W * T. The device-to-device copy a pass is compared with moves the same total: one
// cudaMemcpyAsync of half as many bytes, each read once and written once.
// In loopback every rank's traffic crosses one GPU's memory, so the rate is the whole GPU's. The
// counts are logical: a home row that several of its k routes read may come from L2, not HBM.
#include <cstdint>

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

// The rows one exchange moves, over all ranks.
struct RowTraffic {
  int64_t routed = 0;       // routes to a real expert
  int64_t padded_rows = 0;  // schedule rows: routed + padding to tile_m per expert
  int64_t tokens = 0;       // W * T
  int64_t row_bytes = 0;    // 2 * D
};

inline double bytes_moved(Pass pass, const RowTraffic& t) {
  const bool pull = pass == Pass::kDispatch || pass == Pass::kReverseCombine;
  const int64_t rows = pull ? t.routed + t.padded_rows : 3 * t.routed + t.tokens;
  return static_cast<double>(rows) * static_cast<double>(t.row_bytes);
}

}  // namespace caracal::bench
