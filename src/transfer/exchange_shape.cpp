#include "caracal/transfer/exchange_shape.hpp"

#include <limits>

#include "caracal/error.hpp"

namespace caracal::transfer {

namespace {

constexpr int64_t kMaxIndex = std::numeric_limits<int32_t>::max();  // routes and rows use 32-bit indices
constexpr const char* kWhere = "TokenExchange: ";

// Warps per CTA of the schedule builder, whose shared memory holds one counter array per warp.
constexpr int64_t kScheduleWarps = kScheduleBlockChunks;

}  // namespace

ExchangeSizes exchange_sizes(const ExchangeShape& shape, int64_t world_size) {
  CARACAL_CHECK(world_size >= 1, kWhere, "world_size must be at least 1, got ", world_size);
  CARACAL_CHECK(shape.tokens >= 1, kWhere, "tokens must be at least 1, got ", shape.tokens);
  CARACAL_CHECK(shape.top_k >= 1, kWhere, "top_k must be at least 1, got ", shape.top_k);
  CARACAL_CHECK(shape.hidden >= kHiddenAlignment && shape.hidden % kHiddenAlignment == 0, kWhere,
                "hidden must be a positive multiple of ", kHiddenAlignment,
                " (rows move as 16-byte vectors of 8 bf16), got ", shape.hidden);
  CARACAL_CHECK(shape.hidden <= kMaxIndex, kWhere, "hidden must be below 2^31, got ", shape.hidden);
  CARACAL_CHECK(shape.precision == Precision::kBF16, kWhere,
                "precision must be bf16 (the pulls move rows without scales), got ", to_string(shape.precision));
  CARACAL_CHECK(shape.num_experts >= 1, kWhere, "num_experts must be at least 1, got ", shape.num_experts);
  CARACAL_CHECK(shape.num_experts % world_size == 0, kWhere, "num_experts (", shape.num_experts,
                ") must be divisible by the world size (", world_size, ")");
  CARACAL_CHECK(shape.tile_m >= 1 && shape.tile_m <= kMaxIndex, kWhere, "tile_m must be in [1, 2^31), got ",
                shape.tile_m);
  // Each product is checked before the next one is formed, so nothing overflows int64.
  CARACAL_CHECK(shape.tokens <= kMaxIndex / shape.top_k && shape.tokens * shape.top_k <= kMaxIndex / world_size, kWhere,
                "world_size * tokens * top_k = ", world_size, " * ", shape.tokens, " * ", shape.top_k,
                " must be below 2^31 (32-bit route indices)");

  ExchangeSizes sizes;
  sizes.world_size = world_size;
  sizes.routes = shape.tokens * shape.top_k;
  sizes.local_experts = shape.num_experts / world_size;
  const int64_t padding = shape.tile_m - 1;
  CARACAL_CHECK(padding <= (kMaxIndex - world_size * sizes.routes) / sizes.local_experts, kWhere,
                "the row capacity world_size * tokens * top_k + (num_experts / world_size) * (tile_m - 1) = ",
                world_size * sizes.routes, " + ", sizes.local_experts, " * ", padding,
                " must be below 2^31 (32-bit row indices): lower tile_m or the token count");
  sizes.row_capacity = world_size * sizes.routes + sizes.local_experts * padding;
  sizes.chunks = (sizes.routes + kScheduleChunkRoutes - 1) / kScheduleChunkRoutes;
  sizes.blocks = (sizes.chunks + kScheduleBlockChunks - 1) / kScheduleBlockChunks;
  sizes.pulled_row_bytes = row_format(shape.precision).row_bytes(shape.hidden);
  sizes.home_rows = (shape.tokens + shape.tile_m - 1) / shape.tile_m * shape.tile_m;
  // E + (2 + warps) * L + 1 ints: see schedule::shared_ints (schedule_build.cuh).
  const int64_t shared_ints = shape.num_experts + (2 + kScheduleWarps) * sizes.local_experts + 1;
  sizes.schedule_shared_bytes = static_cast<size_t>(shared_ints) * sizeof(int32_t);
  CARACAL_CHECK(sizes.schedule_shared_bytes <= kMaxSharedBytesPerCta, kWhere, "num_experts = ", shape.num_experts,
                " with world_size ", world_size, " needs ", sizes.schedule_shared_bytes,
                " bytes of shared memory per schedule CTA (num_experts + ", 2 + kScheduleWarps,
                " * num_experts / world_size + 1 ints), "
                "more than the ",
                kMaxSharedBytesPerCta, " a Hopper CTA has");
  return sizes;
}

}  // namespace caracal::transfer
