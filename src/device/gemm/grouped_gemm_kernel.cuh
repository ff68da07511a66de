#pragma once
// The persistent, warp-specialized grouped-GEMM kernel: warpgroup 0 produces (TMA), warpgroups
// 1 and 2 consume (wgmma + epilogue). Each CTA walks its tiles from the Gemm's scheduler;
// producer and consumers meet only through the stage ring, so the producer loads the next tile
// while the consumers run the epilogue of the last. The consumers split each tile by rows and
// run together (cooperative), or take its halves in turn (ping-pong, consumer_turns.cuh: one's
// epilogue under the other's mainloop).
//
// `Gemm` describes one kernel:
//   OperandA, OperandB  operand kinds (operand_loads.cuh): their majorness and TMA loads
//   Scheduler           RowTileScheduler (M = rows) or WeightTileScheduler (K = rows), built from
//                       its Params, the CTA's first tile and the stride between its tiles;
//                       locate(params, tile) places a tile's rows in the row buffers; row tiles
//                       may instead come from a tile queue (Params::tile_queue, tile_queue.cuh)
//   Epilogue            apply(params, tile, accum, active, ring, warpgroup) per tile and warpgroup
//   kPingPong           optional, true: ping-pong consumers (mainloop.cuh's trait)
// The kernel's parameters and shared storage are composed of the collectives' own.
#include <cstdint>
#include <type_traits>

#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/tensor.hpp>
#include <cutlass/arch/reg_reconfig.h>

#include "device/gemm/chunk_store.cuh"
#include "device/gemm/consumer_turns.cuh"
#include "device/gemm/gemm_config.cuh"
#include "device/gemm/mainloop.cuh"
#include "device/gemm/mma_config.cuh"
#include "device/gemm/tile_coord.cuh"
#include "device/gemm/tile_queue.cuh"
#include "device/gemm/tma_pipeline.cuh"

namespace caracal::gemm {

// Launch parameters: passed as a __grid_constant__ so the TMA descriptors stay in parameter space,
// where the TMA unit can read them.
template <class SchedulerParams, class EpilogueParams>
struct KernelParams {
  MainloopParams mainloop;
  SchedulerParams scheduler;
  EpilogueParams epilogue;
};

// A Gemm's setmaxnreg budgets: kDefaultRegisterSplit unless it declares `static constexpr
// RegisterSplit kRegisterSplit` (a producer that needs more than 40 registers).
template <class Gemm, class = void>
inline constexpr RegisterSplit kRegisterSplit = kDefaultRegisterSplit;
template <class Gemm>
inline constexpr RegisterSplit kRegisterSplit<Gemm, std::void_t<decltype(Gemm::kRegisterSplit)>> = Gemm::kRegisterSplit;

template <class Gemm>
using GemmParams = KernelParams<typename Gemm::Scheduler::Params, typename Gemm::Epilogue::Params>;

struct KernelStorage {
  MainloopStorage mainloop;
  ChunkStoreStorage epilogue;
};
// The dynamic shared-memory base is only guaranteed 16-byte aligned: ask for 1 KiB of slack.
inline constexpr int kSmemBytes = int(sizeof(KernelStorage)) + 1024;
static_assert(kSmemBytes <= 227 * 1024, "over the 227 KiB of shared memory a Hopper block may use");

// Before a tile's mainloop, for a warpgroup with rows to compute: the partial sums its epilogue
// continues (the weight gradients over a window, where the scheduler found the tile's sum to start
// and stop); whether there were any.
template <class Gemm, class Scheduler, class Accum>
__device__ bool load_partials(GemmParams<Gemm> const& p, Scheduler const& scheduler, TileCoord const& tile,
                              Accum& accum, bool active, int consumer) {
  if constexpr (kLoadsPartials<typename Gemm::Epilogue>) {
    if (!active) return false;
    // Fenced off from the wgmmas on both sides (no wgmma pending, the loads ordered before the
    // next): without it ptxas serializes the kernel's wgmmas (C7515).
    cute::warpgroup_wait<0>();
    cute::warpgroup_fence_operand(accum);
    bool const continued = Gemm::Epilogue::load_partial(p.epilogue, tile, scheduler.window(), accum, consumer);
    cute::warpgroup_fence_operand(accum);
    return continued;
  }
  return false;
}

template <class Gemm, class Scheduler, class Accum>
__device__ void apply_epilogue(GemmParams<Gemm> const& p, Scheduler const& scheduler, TileCoord const& tile,
                               Accum& accum, bool active, ChunkStoreRing& ring, int consumer) {
  if constexpr (kLoadsPartials<typename Gemm::Epilogue>) {
    Gemm::Epilogue::apply(p.epilogue, tile, scheduler.window(), accum, active, ring, consumer);
  } else {
    Gemm::Epilogue::apply(p.epilogue, tile, accum, active, ring, consumer);
  }
}

// Cooperative consumers: both warpgroups on every tile, warpgroup w on its rows [64w, 64w + 64).
template <class Gemm, class Scheduler, class TiledMma, class FragA, class FragB, class Accum>
__device__ void consume_cooperatively(GemmParams<Gemm> const& p, Scheduler& scheduler, uint32_t* queue,
                                      TmaPipeline const& pipe, TiledMma& tiled_mma, FragA const& tCrA,
                                      FragB const& tCrB, Accum& accum, ChunkStoreRing& ring, int consumer, int lane) {
  PipelineState st;
  for (;; scheduler.advance()) {
    if (queue != nullptr) {
      if (!consumer_take_tile<Gemm>(queue, scheduler, pipe, st)) break;
    } else if (!scheduler.has_tile()) {
      break;
    }
    TileCoord tile = scheduler.coord();
    Gemm::Scheduler::locate(p.scheduler, tile);
    bool const active = tile.m_begin + consumer * kWarpgroupRows < tile.active_end;
    bool const continued = load_partials<Gemm>(p, scheduler, tile, accum, active, consumer);
    mma_tile(tiled_mma, tCrA, tCrB, accum, pipe, st, tile.k_tiles, active, lane, false, continued);
    apply_epilogue<Gemm>(p, scheduler, tile, accum, active, ring, consumer);
  }
}

// Ping-pong consumers (consumer_turns.cuh): warpgroup w computes half w of every tile, the two
// mainloops in turn, each warpgroup's epilogue after it has passed the turn. `handoff`: the
// shared-memory word through which warpgroup 0 hands a queued tile to warpgroup 1.
template <class Gemm, class Scheduler, class TiledMma, class FragA, class FragB, class Accum>
__device__ void consume_in_turns(GemmParams<Gemm> const& p, Scheduler& scheduler, uint32_t* queue, int& handoff,
                                 TmaPipeline const& pipe, TiledMma& tiled_mma, FragA const& tCrA, FragB const& tCrB,
                                 Accum& accum, ChunkStoreRing& ring, int consumer, int lane) {
  MainloopTurns turns(consumer);
  PipelineState st;
  int behind = 0;  // warpgroup 0: the stages of the last tile's half 1, not yet passed over
  for (bool first = true;; first = false) {
    // A tile at a fixed stride each warpgroup finds itself, and loads its partial sums before its
    // turn; a queued tile warpgroup 0 takes in its turn (the tile's first stage may follow stages
    // warpgroup 1 has not waited on yet) and hands over.
    TileCoord tile{};
    bool has_tile = false;
    bool continued = false;
    if (queue == nullptr) {
      if (!first) scheduler.advance();
      has_tile = scheduler.has_tile();
      if (has_tile) {
        tile = scheduler.coord();
        Gemm::Scheduler::locate(p.scheduler, tile);
        continued = load_partials<Gemm>(p, scheduler, tile, accum,
                                  tile.m_begin + consumer * kWarpgroupRows < tile.active_end, consumer);
      }
    }
    turns.wait();
    if (consumer == 0) st.skip(behind);
    if constexpr (kTakesTileQueue<Gemm>) {
      if (queue != nullptr) {
        int t;
        if (consumer == 0) {
          t = consumer_tile_index(queue, pipe, st);
          if (threadIdx.x % kWarpgroupThreads == 0) handoff = t;
        } else {
          t = handoff;  // written before warpgroup 0 passed the turn
        }
        has_tile = t >= 0;
        if (has_tile) {
          scheduler.seek(t);
          tile = scheduler.coord();
          Gemm::Scheduler::locate(p.scheduler, tile);
        }
      }
    }
    if (!has_tile) {
      if (consumer == 0) turns.pass();  // warpgroup 1 learns it too
      break;
    }
    if (consumer == 1) st.skip(half_stages(tile, 0));
    bool const active = tile.m_begin + consumer * kWarpgroupRows < tile.active_end;
    mma_tile(tiled_mma, tCrA, tCrB, accum, pipe, st, half_stages(tile, consumer), active, lane, false, continued);
    turns.pass();
    behind = half_stages(tile, 1);
    apply_epilogue<Gemm>(p, scheduler, tile, accum, active, ring, consumer);
  }
}

template <class Gemm>
__global__ void __launch_bounds__(kThreads, 1)
    grouped_gemm_kernel(CUTE_GRID_CONSTANT GemmParams<Gemm> const p) {
  using namespace cute;
  using Mma = MmaConfig<Gemm::OperandA::kMajor, Gemm::OperandB::kMajor>;
  constexpr RegisterSplit kRegisters = kRegisterSplit<Gemm>;
  static_assert(kRegisters.producer * kWarpgroupThreads + kRegisters.consumer * kConsumerWarpgroups * kWarpgroupThreads <=
                    168 * kThreads && kRegisters.producer % 8 == 0 && kRegisters.consumer % 8 == 0,
                "setmaxnreg budgets over the 168 registers per thread of the launch, or not multiples of 8");
  // Ping-pong with a tile queue: the tile warpgroup 0 took for both (-1: none left). Not in
  // KernelStorage, whose 1024-byte alignment would round one more word up to a whole KiB.
  __shared__ int handoff_tile;
  extern __shared__ uint8_t smem_raw[];
  // Round the base up to the 1024-byte swizzle period (kSmemBytes holds the slack).
  KernelStorage& smem = *reinterpret_cast<KernelStorage*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));

  // Warp-uniform role indices (the shuffle tells the compiler they are uniform).
  int const warpgroup = __shfl_sync(0xffffffffu, int(threadIdx.x) / kWarpgroupThreads, 0);
  int const lane = int(threadIdx.x) % 32;

  TmaPipeline const pipe(smem.mainloop.full, smem.mainloop.empty);
  if (threadIdx.x == 0) {
    pipe.init(1, kPingPong<Gemm> ? kConsumerWarps / kConsumerWarpgroups : kConsumerWarps);
    prefetch_tma_descriptor(&p.mainloop.a);
    prefetch_tma_descriptor(&p.mainloop.b);
  }
  __syncthreads();

  // Standalone, the CTAs of the launch share the tiles; a fused kernel would pass its GEMM role's.
  // Row tiles may come from a queue instead (tile_queue.cuh): in order, whichever CTA is free.
  typename Gemm::Scheduler scheduler(p.scheduler, int(blockIdx.x), int(gridDim.x));
  uint32_t* const queue = tile_queue<Gemm>(p.scheduler);

  if (warpgroup == 0) {
    // Producer: one thread issues every TMA load; the rest of the warpgroup retires.
    cutlass::arch::warpgroup_reg_dealloc<kRegisters.producer>();
    if (threadIdx.x == 0) {
      PipelineState st;
      for (;; scheduler.advance()) {  // with a queue, advance() is overridden by seek()
        if (queue != nullptr) {  // a constant nullptr where the Gemm takes no queue
          if (!producer_take_tile<Gemm>(queue, scheduler, pipe, st)) break;
        } else if (!scheduler.has_tile()) {
          break;
        }
        TileCoord tile = scheduler.coord();
        Gemm::Scheduler::locate(p.scheduler, tile);
        load_tile<Gemm>(p.mainloop, p.epilogue, smem.mainloop, pipe, st, tile);
        if constexpr (kPingPong<Gemm>) {
          if (half_streamed(tile, 1)) load_tile<Gemm>(p.mainloop, p.epilogue, smem.mainloop, pipe, st, tile, 1);
        }
      }
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<kRegisters.consumer>();
    int const consumer = warpgroup - 1;                       // 0 or 1
    int const thread = int(threadIdx.x) - kWarpgroupThreads;  // 0..255
    int const wg_thread = thread % kWarpgroupThreads;

    // wgmma operands are shared-memory descriptors: these "fragments" are views of the stages.
    typename Mma::TiledMma tiled_mma;
    auto thr_mma = tiled_mma.get_thread_slice(thread);
    Tensor sA = make_tensor(make_smem_ptr(&smem.mainloop.a[0][0]), typename Mma::SmemLayoutA{});
    Tensor sB = make_tensor(make_smem_ptr(&smem.mainloop.b[0][0]), typename Mma::SmemLayoutB{});
    Tensor tCrA = thr_mma.make_fragment_A(thr_mma.partition_A(sA));  // (MMA, MMA_M, MMA_K, stage)
    Tensor tCrB = thr_mma.make_fragment_B(thr_mma.partition_B(sB));  // (MMA, MMA_N, MMA_K, stage)
    Tensor accum = partition_fragment_C(tiled_mma, Shape<Int<kBlockM>, Int<kBlockN>>{});
    static_assert(decltype(size(accum))::value == kAccumulators);

    ChunkStoreRing ring(smem.epilogue.chunks[consumer], consumer, wg_thread);
    if constexpr (kPingPong<Gemm>) {
      consume_in_turns<Gemm>(p, scheduler, queue, handoff_tile, pipe, tiled_mma, tCrA, tCrB, accum, ring,
                             consumer, lane);
    } else {
      consume_cooperatively<Gemm>(p, scheduler, queue, pipe, tiled_mma, tCrA, tCrB, accum, ring, consumer, lane);
    }
    ring.drain();
  }
}

}  // namespace caracal::gemm
