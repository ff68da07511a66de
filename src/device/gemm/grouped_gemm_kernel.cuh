#pragma once
// The persistent, warp-specialized grouped-GEMM kernel on persistent_task_kernel.cuh's skeleton:
// warpgroup 0 produces (TMA), warpgroups 1 and 2 consume (wgmma + epilogue). Each CTA walks its
// tiles from the Gemm's scheduler; producer and consumers meet only through the stage ring, so the
// producer loads the next tile while the consumers run the epilogue of the last.
//
// `Gemm` describes one kernel: a GEMM of src/device/gemm/expert_gemms/ (what it computes)
//   Policy              precision, tile and stages (gemm_policy.cuh): the mainloop's and the storage's
//   OperandA, OperandB  operand kinds (operand_loads.cuh): their majorness and TMA loads
//   Epilogue            apply(params, tile, accum, active, ring, warpgroup) per tile and warpgroup
// An OperandA of gathered_fp8_rows.cuh (the FP8 up/gate's x read where the tokens are) is copied by
// the whole producer warpgroup instead (no IdleWarps), its source in the mainloop's parameters.
// with how this kernel walks its tiles (Scheduled below, ScheduledInPairs in paired_gemm_kernel.cuh)
//   Scheduler           RowTileScheduler (M = rows) or WeightTileScheduler (K = rows), built from
//                       its Params, the CTA's first tile and the stride between its tiles;
//                       locate(params, tile) places a tile's rows in the row buffers; row tiles
//                       may instead come from a tile queue (Params::tile_queue, tile_queue.cuh)
// The kernel's parameters and shared storage are composed of the collectives' own.
#include <cstdint>
#include <type_traits>

#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/tensor.hpp>
#include <cutlass/arch/reg_reconfig.h>

#include "device/gemm/chunk_store.cuh"
#include "device/gemm/gathered_fp8_rows.cuh"
#include "device/gemm/gemm_config.cuh"
#include "device/gemm/gemm_policy.cuh"
#include "device/gemm/mainloop.cuh"
#include "device/gemm/mma_config.cuh"
#include "device/gemm/operand_loads.cuh"
#include "device/gemm/persistent_task_kernel.cuh"
#include "device/gemm/tile_coord.cuh"
#include "device/gemm/tile_queue.cuh"
#include "device/gemm/tma_pipeline.cuh"

namespace caracal::gemm {

// A GEMM of src/device/gemm/expert_gemms/ as a kernel of its own runs it: one CTA a tile, the tiles
// from TileScheduler.
template <class ExpertGemm, class TileScheduler>
struct Scheduled : ExpertGemm {
  using Scheduler = TileScheduler;
};

// Work for the producer warpgroup's warps that issue no loads (warps 1-3 of every CTA), which
// otherwise retire at once: a Gemm may declare `using IdleWarps = W`, W with a `Params` type and
// `static __device__ void run(W::Params const&, int worker, int workers, int lane)`, run by each of
// those warps with its place `worker` among the launch's `workers` of them. It shares the SM with
// the tiles, so it suits work that no tile waits on (a fused kernel's side job, e.g.
// src/fused/weight_grad_dx_sums.cuh), within the producer's register budget.
struct NoIdleWarps {
  struct Params {};
};
template <class Gemm, class = void>
struct IdleWarpsOf {
  using type = NoIdleWarps;
};
template <class Gemm>
struct IdleWarpsOf<Gemm, std::void_t<typename Gemm::IdleWarps>> {
  using type = typename Gemm::IdleWarps;
};
template <class Gemm>
inline constexpr bool kHasIdleWarps = !std::is_same_v<typename IdleWarpsOf<Gemm>::type, NoIdleWarps>;

// Launch parameters: passed as a __grid_constant__ so the TMA descriptors stay in parameter space,
// where the TMA unit can read them. The mainloop's are its policy's collective's (mainloop.cuh).
template <class SchedulerParams, class EpilogueParams, class IdleWarpsParams = NoIdleWarps::Params,
          class MainloopParamsOf = MainloopParams>
struct KernelParams {
  MainloopParamsOf mainloop;
  SchedulerParams scheduler;
  EpilogueParams epilogue;
  IdleWarpsParams idle_warps;  // Gemm::IdleWarps's, if any
};

// A Gemm's setmaxnreg budgets: kDefaultRegisterSplit unless it declares `static constexpr
// RegisterSplit kRegisterSplit` (a producer that needs more than 40 registers).
template <class Gemm, class = void>
inline constexpr RegisterSplit kRegisterSplit = kDefaultRegisterSplit;
template <class Gemm>
inline constexpr RegisterSplit kRegisterSplit<Gemm, std::void_t<decltype(Gemm::kRegisterSplit)>> = Gemm::kRegisterSplit;

// Whether the Gemm's A is gathered by the producer warpgroup (gathered_fp8_rows.cuh), and its
// mainloop's parameters then: the collective's and where A's rows are.
template <class Gemm>
inline constexpr bool kGathersA = kIsGathered<typename Gemm::OperandA>;
template <class CollectiveParams>
struct WithGatheredA : CollectiveParams {
  GatheredFp8RowsSource a_rows;
};
template <class Gemm>
using MainloopParamsOfGemm =
    std::conditional_t<kGathersA<Gemm>, WithGatheredA<typename Mainloop<typename Gemm::Policy>::Params>,
                       typename Mainloop<typename Gemm::Policy>::Params>;

template <class Gemm>
using GemmParams = KernelParams<typename Gemm::Scheduler::Params, typename Gemm::Epilogue::Params,
                                typename IdleWarpsOf<Gemm>::type::Params, MainloopParamsOfGemm<Gemm>>;

// In the producer warpgroup, after the register handover: its warps 1-3 run the Gemm's IdleWarps
// work, if any (the producer thread's warp returns).
template <class Gemm>
__device__ __forceinline__ void run_idle_warps(GemmParams<Gemm> const& p, int lane) {
  if constexpr (kHasIdleWarps<Gemm>) {
    int const warp = int(threadIdx.x) / 32;
    if (warp == 0) return;
    IdleWarpsOf<Gemm>::type::run(p.idle_warps, int(blockIdx.x) * kIdleWarpsPerCta + warp - 1,
                                 int(gridDim.x) * kIdleWarpsPerCta, lane);
  }
}

// A Gemm's setmaxnreg budgets, checked against the registers of the launch.
template <class Gemm>
constexpr RegisterSplit checked_register_split() {
  constexpr RegisterSplit r = kRegisterSplit<Gemm>;
  static_assert(fits_launch_registers(r),
                "setmaxnreg budgets over the 168 registers per thread of the launch, or not multiples of 8");
  return r;
}

// A consumer warpgroup's share of one tile: the wgmma mainloop, then the epilogue (`stores`: the
// tile exists; a CTA pair's follower walks the stages of a missing second tile without one). The
// weight gradients over a window (kLoadsPartials) first load the partial sum their expert's window
// continues from, as the scheduler found it (no loads of the offsets per tile).
template <class Gemm, class Scheduler, class TiledMma, class FragA, class FragB, class StageScales, class Accum,
          class Pipeline, class Ring>
__device__ __forceinline__ void consume_tile(typename Gemm::Epilogue::Params const& epilogue,
                                             Scheduler const& scheduler, TileCoord const& tile, bool active,
                                             bool stores, TiledMma& tiled_mma, FragA const& tCrA, FragB const& tCrB,
                                             StageScales const& scales, Accum& accum, Pipeline const& pipe,
                                             typename Pipeline::State& st, Ring& ring, int consumer,
                                             int lane) {
  using namespace cute;
  if constexpr (kLoadsPartials<typename Gemm::Epilogue>) {
    auto const& window = scheduler.window();
    bool continued = false;
    if (active) {
      // Fenced off from the wgmmas on both sides (no wgmma pending, the loads ordered before
      // the next): without it ptxas serializes the kernel's wgmmas (C7515).
      warpgroup_wait<0>();
      warpgroup_fence_operand(accum);
      continued = Gemm::Epilogue::load_partial(epilogue, tile, window, accum, consumer);
      warpgroup_fence_operand(accum);
    }
    mma_tile(tiled_mma, tCrA, tCrB, scales, accum, pipe, st, tile.k_tiles, active, lane, kGathersA<Gemm>, continued);
    if (stores) Gemm::Epilogue::apply(epilogue, tile, window, accum, active, ring, consumer);
  } else {
    mma_tile(tiled_mma, tCrA, tCrB, scales, accum, pipe, st, tile.k_tiles, active, lane, kGathersA<Gemm>);
    if (stores) Gemm::Epilogue::apply(epilogue, tile, accum, active, ring, consumer);
  }
}

// The producer warpgroup (`thread` in [0, kGatherThreads)) of a Gemm whose A it gathers: every
// thread walks the CTA's tiles, from the tile queue where there is one (thread 0 takes each tile as
// producer_take_tile does and the others read it from the stage's slot after the warpgroup meets:
// the slot is rewritten only once the stage is released, after every thread's arrival on it) or
// else at the fixed stride; per tile it learns its rows' tokens, per k tile thread 0 loads B and its
// scales by TMA (arrive_and_expect_tx of their bytes) and every thread copies its share of A's
// codes and scales, arriving once they land. At the queue's end every thread arrives once on the
// end stage besides thread 0's producer_arrive.
template <class Gemm>
__device__ void produce_gathered_a_tiles(GemmParams<Gemm> const& p,
                                         typename Mainloop<typename Gemm::Policy>::Storage& smem,
                                         TmaPipeline<Gemm::Policy::kStages> const& pipe,
                                         typename Gemm::Scheduler& scheduler, uint32_t* queue, int thread) {
  using Policy = typename Gemm::Policy;
  using Collective = Mainloop<Policy>;
  static_assert(Policy::kBlockScaled, "gathered A rows are e4m3 with their scales");
  static_assert(!kHasIdleWarps<Gemm> && !kPrefetchesSource<typename Gemm::Epilogue>,
                "the producer warpgroup gathers: no other work for it");
  constexpr uint32_t kTmaBytes = Policy::B::kBytes + ScaleTile<typename Policy::B>::kBytes;
  PipelineState<Policy::kStages> st;
  for (;; scheduler.advance()) {  // with a queue, advance() is overridden by seek()
    if (queue != nullptr) {
      if (thread == 0) producer_take_tile<Gemm, 1>(queue, scheduler, pipe, st);
      gather_threads_sync();  // thread 0's slot written
      uint32_t const t = *static_cast<volatile uint32_t*>(tile_slot<Policy::kStages>(queue, st.stage));
      if (t == kNoMoreTiles) {
        cutlass::arch::ClusterBarrier::arrive(&smem.full[st.stage]);
        break;
      }
      scheduler.seek(int(t));
    } else if (!scheduler.has_tile()) {
      break;
    }
    TileCoord tile = scheduler.coord();
    Gemm::Scheduler::locate(p.scheduler, tile);
    GatheredFp8Tile const rows = gathered_fp8_tile(p.mainloop.a_rows, tile.m_begin, thread);
    for (int k = 0; k < tile.k_tiles; ++k) {
      pipe.producer_acquire(st);
      uint64_t* const full = &smem.full[st.stage];
      int const k_index = tile.k_begin + k * Policy::kBlockK;
      if (thread == 0) {
        pipe.producer_expect(st, kTmaBytes);
        Collective::template load_b<Gemm>(p.mainloop, full, smem, st.stage, tile.n_begin, k_index, tile.expert);
      }
      gather_fp8_k_tile<typename Policy::A>(rows, p.mainloop.a_rows.codes, k_index, smem.a[st.stage],
                                            smem.scales_a[st.stage], full, thread);
      st.advance();
    }
  }
}

template <class Gemm>
__global__ void __launch_bounds__(kThreads, 1)
    grouped_gemm_kernel(CUTE_GRID_CONSTANT GemmParams<Gemm> const p) {
  using namespace cute;
  using Policy = typename Gemm::Policy;
  using Mma = MmaConfigOf<Gemm>;
  constexpr RegisterSplit kRegisters = checked_register_split<Gemm>();
  extern __shared__ uint8_t smem_raw[];
  KernelStorage<Policy>& smem = kernel_storage<Policy>(smem_raw);

  int const warpgroup = warpgroup_role();
  int const lane = int(threadIdx.x) % 32;

  TmaPipeline const pipe(smem.mainloop.full, smem.mainloop.empty);
  start_persistent_cta(
      [&] {
        if constexpr (kGathersA<Gemm>) {
          pipe.init(1 + kGatherArrivals);  // every producer thread arrives too (produce_gathered_a_tiles)
          cute::prefetch_tma_descriptor(&p.mainloop.b);
          cute::prefetch_tma_descriptor(&p.mainloop.scales_b);
        } else {
          pipe.init();
          Mainloop<Policy>::prefetch_descriptors(p.mainloop);
        }
      },
      [] { __syncthreads(); });

  // Standalone, the CTAs of the launch share the tiles; a fused kernel would pass its GEMM role's.
  // Row tiles may come from a queue instead (tile_queue.cuh): in order, whichever CTA is free.
  typename Gemm::Scheduler scheduler(p.scheduler, int(blockIdx.x), int(gridDim.x));
  uint32_t* const queue = tile_queue<Gemm>(p.scheduler);

  if (warpgroup == 0) {
    run_producer_warpgroup<kRegisters.producer>([&] {
      if constexpr (kGathersA<Gemm>) {
        produce_gathered_a_tiles<Gemm>(p, smem.mainloop, pipe, scheduler, queue, int(threadIdx.x));
      } else {
        // One thread issues every TMA load; the rest of the warpgroup retires, or runs the Gemm's
        // IdleWarps work.
        if (threadIdx.x == 0) {
          PipelineState<Policy::kStages> st;
          for (;; scheduler.advance()) {  // with a queue, advance() is overridden by seek()
            if (queue != nullptr) {  // a constant nullptr where the Gemm takes no queue
              if (!producer_take_tile<Gemm, 1>(queue, scheduler, pipe, st)) break;
            } else if (!scheduler.has_tile()) {
              break;
            }
            TileCoord tile = scheduler.coord();
            Gemm::Scheduler::locate(p.scheduler, tile);
            load_tile<Gemm>(p.mainloop, p.epilogue, smem.mainloop, pipe, st, tile);
          }
        }
        run_idle_warps<Gemm>(p, lane);
      }
    });
  } else {
    // run_consumer_warpgroup's setup, written out (persistent_task_kernel.cuh).
    cutlass::arch::warpgroup_reg_alloc<kRegisters.consumer>();
    int const consumer = warpgroup - 1;                       // 0 or 1
    int const thread = int(threadIdx.x) - kWarpgroupThreads;  // 0..255
    int const wg_thread = thread % kWarpgroupThreads;

    typename Mma::TiledMma tiled_mma;
    Tensor tCrA = stage_fragment_a<Mma>(tiled_mma, smem.mainloop, thread);
    Tensor tCrB = stage_fragment_b<Mma>(tiled_mma, smem.mainloop, thread);
    auto const scales = Mainloop<Policy>::stage_scales(smem.mainloop, thread);
    Tensor accum = partition_fragment_C(tiled_mma, Shape<Int<Policy::kBlockM>, Int<Policy::kBlockN>>{});
    static_assert(kTileNOf<decltype(accum)> == Policy::kBlockN, "the accumulators cover the policy's tile");

    ChunkStoreRingOf<Policy::kChunkBuffers> ring(smem.epilogue.chunks[consumer], consumer, wg_thread);
    PipelineState<Policy::kStages> st;
    for (;; scheduler.advance()) {
      if (queue != nullptr) {
        if (!consumer_take_tile<Gemm>(queue, scheduler, pipe, st)) break;
      } else if (!scheduler.has_tile()) {
        break;
      }
      TileCoord tile = scheduler.coord();
      Gemm::Scheduler::locate(p.scheduler, tile);
      bool const active = tile.m_begin + consumer * kWarpgroupRows < tile.active_end;
      consume_tile<Gemm>(p.epilogue, scheduler, tile, active, /*stores=*/true, tiled_mma, tCrA, tCrB, scales,
                         accum, pipe, st, ring, consumer, lane);
    }
    ring.drain();
  }
}

}  // namespace caracal::gemm
