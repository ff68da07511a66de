#pragma once
// The shape of one token exchange (DESIGN §2) and the sizes that follow from it in a world of W
// ranks. Host only; every device index derived from these sizes fits in 32 bits (checked here).
#include <cstddef>
#include <cstdint>

#include "caracal/layer_config.hpp"
#include "caracal/row_format.hpp"

namespace caracal::transfer {

// bf16 values per 16-byte vector: rows move as whole vectors, so `hidden` must be a multiple.
inline constexpr int64_t kHiddenAlignment = 8;
// Routes one warp of the schedule builder pulls, counts and places as one chunk, and chunks one of
// its CTAs takes at once as a block (a warp each): small, so that a step's blocks keep many SMs
// busy and each warp's chain of dependent steps stays short.
inline constexpr int64_t kScheduleChunkRoutes = 64;
// Threads per CTA of the exchange kernels. A launch of G CTAs touches at most G SMs, so capping G
// (ExchangeOptions::max_sms) leaves the other SMs wholly free for concurrent work; the CTAs are
// large so that a few of them still keep enough copies in flight, each sized to its kernel's
// registers (one CTA fills an SM's register file).
inline constexpr int kPullThreads = 1024;      // dispatch, reverse combine: 64 registers
inline constexpr int kReduceThreads = 768;     // combine, reverse dispatch: the sums need ~80
inline constexpr int kScheduleThreads = 512;
inline constexpr int64_t kScheduleBlockChunks = kScheduleThreads / 32;
// Local ranks whose y combine can write into the caller's buffers (TokenExchange::combine's `y`).
inline constexpr int kMaxCombineOutputs = 8;
// SMs the exchange leaves free by default: room for an NCCL collective on another stream (DDP or
// FSDP gradient reduction during backward) to progress while exchange CTAs spin on peers.
inline constexpr int kExchangeFreeSms = 16;
// The largest dynamic shared memory a Hopper CTA may use (227 KiB).
inline constexpr size_t kMaxSharedBytesPerCta = 227 * 1024;

struct ExchangeShape {
  int64_t tokens = 0;       // T: tokens per rank
  int64_t top_k = 0;        // k: slots per token
  int64_t hidden = 0;       // D: values per token row, a multiple of kHiddenAlignment
  int64_t num_experts = 0;  // E: global expert count, divisible by the world size
  int64_t tile_m = 128;     // every expert segment is padded to a multiple of this (the GEMM's M tile)
  // The format of the rows the pulls move (x into expert_x, dy into expert_dy:
  // caracal/row_format.hpp); the pushed rows (expert outputs, dx) are bf16. exchange_sizes takes
  // bf16 only.
  Precision precision = Precision::kBF16;
};

struct ExchangeSizes {
  int64_t world_size = 0;            // W
  int64_t routes = 0;                // T * k routes per home rank
  int64_t local_experts = 0;         // L = E / W
  int64_t row_capacity = 0;          // W*T*k + L*(tile_m - 1): the most rows any rank can receive
  int64_t chunks = 0;                // schedule chunks per source rank: ceil(T*k / kScheduleChunkRoutes)
  int64_t blocks = 0;                // schedule blocks per source rank: ceil(chunks / kScheduleBlockChunks)
  size_t schedule_shared_bytes = 0;  // dynamic shared memory of the schedule builder's CTAs
  int64_t pulled_row_bytes = 0;      // one row of x, expert_x, dy, expert_dy in the shape's precision
  int64_t home_rows = 0;             // T rounded up to tile_m: the home e4m3 rows of x (fp8_dispatch)
};

// Validates `shape` for `world_size` ranks and derives its sizes. Throws caracal::Error naming the
// offending argument and the value expected: world_size, tokens, top_k, hidden (multiple of 8),
// num_experts (divisible by world_size), tile_m, the route count W*T*k and the row capacity
// (both below 2^31: 32-bit indices), the schedule builder's shared memory (E + 10*L + 1 ints), and
// precision (bf16: the pulls move no scales).
ExchangeSizes exchange_sizes(const ExchangeShape& shape, int64_t world_size);

}  // namespace caracal::transfer
