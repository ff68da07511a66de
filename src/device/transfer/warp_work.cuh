#pragma once
// Handing out rows and tokens to warps. The transfers flatten the work of all the process's
// local ranks into one sequence that every warp of the launch strides through: in loopback a
// rank that receives most of the rows (skewed routing) is then served by the whole GPU rather
// than by its own share of the CTAs. With one local rank (NCCL) this is a plain grid-stride loop.
// Every lane of a warp visits the same items, so visit() may use warp-wide operations.
#include <cstdint>

#include "caracal/comm/symmetric_ptr.hpp"
#include "device/comm/cta_place.cuh"
#include "device/comm/device_world.cuh"

namespace caracal::transfer {

// A warp's place among the `count` warps that share some work.
struct WarpWorkers {
  int index = 0;
  int count = 1;
};

// Every warp of `place`'s role, over all local ranks, in (local rank, CTA, warp) order: in a launch
// of one role, all warps of the launch.
__device__ __forceinline__ WarpWorkers role_warps(const comm::DeviceWorld& world, const comm::CtaPlace& place) {
  const int warps_per_cta = static_cast<int>(blockDim.x) / 32;
  return {(place.local_rank * place.count + place.index) * warps_per_cta + static_cast<int>(threadIdx.x) / 32,
          world.local_ranks * place.count * warps_per_cta};
}

// The warps of `place`'s role that serve its own rank, in (CTA, warp) order.
__device__ __forceinline__ WarpWorkers rank_warps(const comm::CtaPlace& place) {
  const int warps_per_cta = static_cast<int>(blockDim.x) / 32;
  return {place.index * warps_per_cta + static_cast<int>(threadIdx.x) / 32, place.count * warps_per_cta};
}

// Every warp of the launch, in (CTA, warp) order.
__device__ __forceinline__ WarpWorkers launch_warps() {
  return {static_cast<int>((blockIdx.x * blockDim.x + threadIdx.x) / 32), static_cast<int>(gridDim.x * blockDim.x) / 32};
}

// This warp's run [begin, end) of `items` items that `workers` share in equal runs of consecutive
// items (the first items % count warps one more): work whose cost is even per item spreads evenly,
// whatever the warps find in it.
struct WarpRun {
  int begin, end;
};
__device__ __forceinline__ WarpRun warp_run(int items, WarpWorkers w) {
  const int begin = w.index * (items / w.count) + min(w.index, items % w.count);
  return {begin, begin + items / w.count + (w.index < items % w.count ? 1 : 0)};
}

// Rows of `vectors` 16-byte vectors, one per token, cut into chunks of one vector a lane: the
// warps of `workers` take equal runs of consecutive chunks (warp_run), so every warp moves about
// the same bytes whatever the routing. Calls visit(token, first, end) for each token piece of this
// warp's run: vectors [first, end) of the token's row (first == 0: the warp holding the row's first
// chunk). tokens * ceil(vectors / 32) must fit in 32 bits.
inline constexpr int kVectorsPerChunk = 32;
template <typename Visit>
__device__ void for_each_token_run(int tokens, int vectors, WarpWorkers workers, Visit&& visit) {
  const int chunks_per_token = (vectors + kVectorsPerChunk - 1) / kVectorsPerChunk;
  const WarpRun run = warp_run(tokens * chunks_per_token, workers);
  for (int chunk = run.begin; chunk < run.end;) {
    const int token = chunk / chunks_per_token;
    const int token_end = min(run.end, (token + 1) * chunks_per_token);
    visit(token, (chunk - token * chunks_per_token) * kVectorsPerChunk,
          min(vectors, (token_end - token * chunks_per_token) * kVectorsPerChunk));
    chunk = token_end;
  }
}

// for_each_token_run over every warp of the launch.
template <typename Visit>
__device__ void for_each_token_run(int tokens, int vectors, Visit&& visit) {
  for_each_token_run(tokens, vectors, launch_warps(), visit);
}

// Calls visit(rank, item) for items [0, count_of(rank)) of every local rank, rank after rank, the
// warps taking turns over the flattened sequence. Only 32-bit divisions: a 64-bit one is a
// subroutine call, around which ptxas spills.
template <typename CountOf, typename Visit>
__device__ void for_each_local_item(const comm::DeviceWorld& world, WarpWorkers workers, CountOf count_of,
                                    Visit&& visit) {
  int phase = 0;  // flattened index of the local rank's item 0, modulo workers.count
  for (int local = 0; local < world.local_ranks; ++local) {
    const int rank = world.first_local_rank + local;
    const int items = count_of(rank);
    const int first = workers.index >= phase ? workers.index - phase : workers.index - phase + workers.count;
    for (int64_t item = first; item < items; item += workers.count) visit(rank, static_cast<int>(item));
    phase = (phase + items % workers.count) % workers.count;
  }
}

// Items [begin, end) dealt to the warps of `workers` in turn (this warp's: begin + index, then
// every count-th), calling visit(item) on the whole warp, in that order, for each item that
// wanted(item) holds for; the lanes test 32 of the warp's items at once. The same items and order
// as a loop over them, but a scan where few items carry work (a pull role's rows at W = 1: none)
// costs one test a lane per 32 items instead of a test a warp each. visit returns false to stop
// the scan; the scan then returns false.
template <typename Wanted, typename Visit>
__device__ bool for_each_wanted_item(int begin, int end, WarpWorkers workers, Wanted&& wanted, Visit&& visit) {
  const int lane = static_cast<int>(threadIdx.x) % 32;
  for (int first = begin + workers.index; first < end; first += 32 * workers.count) {
    const int item = first + lane * workers.count;
    unsigned todo = __ballot_sync(0xffffffffu, item < end && wanted(item));
    while (todo != 0u) {
      const int next = first + (__ffs(todo) - 1) * workers.count;
      todo &= todo - 1u;
      if (!visit(next)) return false;
    }
  }
  return true;
}

// Tokens [0, tokens) of every local rank.
template <typename Visit>
__device__ void for_each_local_token(const comm::DeviceWorld& world, int tokens, WarpWorkers workers, Visit&& visit) {
  for_each_local_item(
      world, workers, [tokens](int) { return tokens; }, visit);
}

}  // namespace caracal::transfer
