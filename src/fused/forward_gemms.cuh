#pragma once
// The fused forward's two GEMMs in one precision, the one seam between the bf16 and the FP8 forward
// (forward_compute.cuh, forward_pull.cuh and forward.cu / forward_fp8.cu take it as `Gemms`):
//   UpGate, Down        the standalone kernels' GEMMs (device/gemm/expert_gemms/), hence the same
//                       bits; one policy, so that they share the CTA's stage ring and storage
//   Pull                where the rows of the up/gate's A are, at home and in the ring (the comm
//                       role pulls other GPUs' rows into the ring in that form)
//   GatheredTile        a producer thread's sources of one up/gate tile (gather_tile below), copied
//                       into each stage by gather_stage
//   kMaxLocalRanks      the local ranks whose GEMM descriptors the kernel's parameters (32 KiB) hold
//   TaskHandOff         how the producer threads learn their tasks (forward_task_handoff.cuh)
//   kProducerRegisters, kConsumerRegisters
//                       the setmaxnreg budgets: (producer + 2 x consumers) x 128 <= 64 K registers
//   kGatheredTmaBytes   the TMA bytes of a gathered stage (B, and its scales)
//   kRematerializesRingOffsets
//                       whether the consumers recompute the chunk ring's offsets each tile
//   kSumsGroupsInLaunch whether the consumers run group_sums tasks (a ring of several macrobatches);
//                       without, the launch takes one macrobatch (ring_rows 0) and the consumers hold
//                       none of the sums' registers
//   kUpGateStoresByThreads
//                       whether the up/gate epilogue stores part of the activation with plain stores
//                       (the FP8 activation's scales) besides the ring's TMA stores: its warpgroup
//                       then meets before the activation is published
#include <cuda_bf16.h>

#include <cstdint>

#include "caracal/schedule_view.hpp"
#include "device/comm/device_world.cuh"
#include "device/gemm/expert_gemms/down_proj.cuh"
#include "device/gemm/expert_gemms/down_proj_fp8.cuh"
#include "device/gemm/expert_gemms/up_gate_swiglu.cuh"
#include "device/gemm/expert_gemms/up_gate_swiglu_fp8.cuh"
#include "device/gemm/gathered_fp8_rows.cuh"
#include "device/gemm/gathered_rows.cuh"
#include "device/gemm/block_scaled_mainloop.cuh"
#include "device/gemm/mainloop.cuh"
#include "device/gemm/operand_loads.cuh"
#include "device/gemm/tile_coord.cuh"
#include "device/gemm/tile_shape.hpp"
#include "device/transfer/pull_fp8_rows.cuh"
#include "device/transfer/pull_rows.cuh"
#include "fused/forward_task_handoff.cuh"
#include "fused/fused_forward.hpp"

namespace caracal::fused {

// The bf16 gather makes its rows' addresses once a tile: it needs no bases resolved before the launch.
struct NoRowBases {};

// The FP8 gather makes its rows' addresses at each stage (its producer holds 32-bit row references),
// from these bases, resolved on the host for each local rank: a lookup in the kernel's parameters
// (the constant cache), not in the world's heap table in global memory.
struct Fp8RowBases {
  const uint8_t* home_codes[kFusedFp8MaxLocalRanks];  // x's e4m3 rows at home, [home_rows][D]
  const float* home_scales[kFusedFp8MaxLocalRanks];   // [D / 128][home_rows]
  const uint8_t* ring_codes[kFusedFp8MaxLocalRanks];  // the rank's expert_x codes, [scale_stride][D]
  const float* ring_scales[kFusedFp8MaxLocalRanks];   // [D / 128][scale_stride]
};

// Where the rows of an up/gate tile are read from, as the producer sees them.
template <class Pull, class RowBases>
struct GatherSources {
  const comm::DeviceWorld& world;
  const Pull& pull;    // home rows (any rank) and this rank's ring rows
  int rank;
  bool pull_all_rows;  // every row is pulled, those of tokens on this GPU too
  const RowBases& bases;
};

// Where schedule row `row` is: a token row on this GPU where it is (at home; `home` its home rank,
// `token` its row there), a row from another GPU where the comm role pulls it (the ring's buffer row;
// `pulled` set), or a padding row nowhere (false).
struct RowPlace {
  bool real, pulled;
  int home, token;
};
template <class Sources>
__device__ inline RowPlace row_place(const Sources& from, const ScheduleView& schedule, int row) {
  const int2 entry = schedule.rows[row];
  if (entry.x < 0) return {false, false, 0, 0};
  const bool pulled =
      from.pull_all_rows ||
      static_cast<unsigned>(entry.x - from.world.first_local_rank) >= static_cast<unsigned>(from.world.local_ranks);
  return {true, pulled, entry.x, entry.y / from.pull.top_k};
}

struct Bf16ForwardGemms {
  using UpGate = gemm::UpGateSwigluGemm;
  using Down = gemm::DownProjGemm;
  using Policy = UpGate::Policy;
  using Pull = transfer::PullRows;
  using RowBases = NoRowBases;
  using Sources = GatherSources<Pull, RowBases>;
  using GatheredTile = gemm::GatherRows;
  static constexpr int kMaxLocalRanks = kFusedMaxLocalRanks;
  // The producer warpgroup also takes tasks over macrobatches, waits on counters and gathers rows
  // (ptxas spills it at 80 registers; the standalone GEMM's producer has 40): 88 x 128 + 208 x 256 =
  // 64512, the 168 x 384 the CTA is launched with.
  static constexpr uint32_t kProducerRegisters = 88;
  using TaskHandOff = TaskPerThread;
  static constexpr uint32_t kConsumerRegisters = 208;
  static constexpr uint32_t kGatheredTmaBytes = Policy::B::kBytes;
  static constexpr bool kUpGateStoresByThreads = false;
  static constexpr bool kRematerializesRingOffsets = false;
  static constexpr bool kSumsGroupsInLaunch = true;

  // Schedule row `row` as a bf16 row (nullptr: zero-filled).
  __device__ static const __nv_bfloat16* row_source(const Sources& from, const ScheduleView& schedule,
                                                    int row, bool& pulled) {
    const int2 entry = schedule.rows[row];
    pulled = false;
    if (entry.x < 0) return nullptr;
    if (!from.pull_all_rows && static_cast<unsigned>(entry.x - from.world.first_local_rank) <
                                   static_cast<unsigned>(from.world.local_ranks)) {
      return from.world.at(from.pull.home_rows, entry.x) + static_cast<int64_t>(entry.y / from.pull.top_k) * from.pull.hidden;
    }
    pulled = true;
    return from.world.at(from.pull.expert_rows, from.rank) + static_cast<int64_t>(schedule.buffer_row(row)) * from.pull.hidden;
  }
  // This producer thread's sources of the tile; `pulled`: whether row `thread` is pulled.
  __device__ static GatheredTile gather_tile(const Sources& from, const ScheduleView& schedule,
                                             const gemm::TileCoord& tile, int thread, bool& pulled) {
    (void)row_source(from, schedule, tile.m_begin + thread, pulled);  // row `thread`: counted
    GatheredTile rows;
    for (int j = 0; j < gemm::kGatherRowsPerThread; ++j) {
      bool unused;
      rows.src[j] = row_source(from, schedule, tile.m_begin + gemm::gather_row(thread, j), unused);
    }
    return rows;
  }
  // Its copies of k tile `k_index` into the stage (`any_address`: for the zero-filling copies).
  template <class Storage>
  __device__ static void gather_stage(const Sources&, const GatheredTile& rows, const void* any_address,
                                      int k_index, Storage& smem, int stage, uint64_t* full, int thread) {
    gemm::gather_k_tile<Policy::A>(rows, static_cast<const __nv_bfloat16*>(any_address), k_index, smem.a[stage], full,
                                   thread);
  }
};

struct Fp8ForwardGemms {
  using UpGate = gemm::Fp8UpGateSwigluGemm;
  using Down = gemm::Fp8DownProjGemm;
  using Policy = UpGate::Policy;
  using Pull = transfer::PullFp8Rows;
  using RowBases = Fp8RowBases;
  using Sources = GatherSources<Pull, RowBases>;
  // Four maps more a group of experts (the operands' scales): half the local ranks of bf16's. A
  // process of a multi-GPU world drives one; loopback worlds of more ranks run the separate launches.
  static constexpr int kMaxLocalRanks = kFusedFp8MaxLocalRanks;
  // 56 x 128 + 224 x 256 = 64512: the producer walks no task cursor (ProducerScratch) and holds its
  // rows as 32-bit references; the consumers' 224 hold the wide FP8 mainloop and epilogues, not the
  // group sums (kSumsGroupsInLaunch).
  static constexpr uint32_t kProducerRegisters = 56;
  using TaskHandOff = TaskThroughScratch;
  static constexpr uint32_t kConsumerRegisters = 224;
  static constexpr uint32_t kGatheredTmaBytes = Policy::B::kBytes + gemm::ScaleTile<Policy::B>::kBytes;
  static constexpr bool kUpGateStoresByThreads = true;
  // The consumers' registers are short: the chunk ring's swizzled offsets are computed at each
  // tile's epilogue, not held across the mainloop (ChunkStoreRing::rematerialize_offsets).
  static constexpr bool kRematerializesRingOffsets = true;
  // One macrobatch a launch (ring_rows 0, forward_fp8.cu): the consumers have no registers left for the sums.
  static constexpr bool kSumsGroupsInLaunch = false;

  // A producer thread's rows of an up/gate tile: for each of its eight rows the byte offset of the
  // row's codes at the thread's unit in the row's source buffer, and for the row whose scales it
  // copies (row `thread`) the row's index there, with every row's source in three bits of one word
  // (the addresses would take twenty of the producer's 56 registers): a stage's address is an add to
  // its source's base. The launch refuses code buffers of 4 GiB or more (forward_fp8.cu).
  struct RowRefs {
    uint32_t offset[gemm::kGatherRowsPerThread];
    uint32_t scale_row;
    uint32_t sources;  // row j's source at bits [3j, 3j + 3), the scale row's at kScaleSourceShift
  };
  using GatheredTile = RowRefs;
  // The sources: 0 .. kMaxLocalRanks - 1 a local rank's home rows, the ring, or a padding row (its
  // copies zero-fill).
  static constexpr uint32_t kPaddingSource = 6, kRingSource = 7, kSourceMask = 7;
  static constexpr int kScaleSourceShift = 3 * gemm::kGatherRowsPerThread;
  static_assert(kMaxLocalRanks <= int(kPaddingSource) && kScaleSourceShift + 3 <= 32,
                "a source number for each local rank's home rows, every row's in one word");

  // Schedule row `row`'s source and its row there.
  __device__ static uint32_t row_source(const Sources& from, const ScheduleView& schedule, int row, uint32_t& index,
                                        bool& pulled) {
    const RowPlace at = row_place(from, schedule, row);
    pulled = at.real && at.pulled;
    index = 0;
    if (!at.real) return kPaddingSource;
    if (!at.pulled) {
      index = uint32_t(at.token);
      return uint32_t(at.home - from.world.first_local_rank);
    }
    index = uint32_t(schedule.buffer_row(row));
    return kRingSource;
  }
  __device__ static GatheredTile gather_tile(const Sources& from, const ScheduleView& schedule,
                                             const gemm::TileCoord& tile, int thread, bool& pulled) {
    GatheredTile rows;
    rows.sources = row_source(from, schedule, tile.m_begin + thread, rows.scale_row, pulled) << kScaleSourceShift;
    const uint32_t unit_offset = uint32_t(thread % 8) * 16u;
    for (int j = 0; j < gemm::kGatherRowsPerThread; ++j) {
      bool unused;
      uint32_t index;
      const uint32_t source = row_source(from, schedule, tile.m_begin + gemm::gather_row(thread, j), index, unused);
      rows.sources |= source << (3 * j);
      rows.offset[j] = index * uint32_t(from.pull.hidden) + unit_offset;
    }
    return rows;
  }
  template <class Storage>
  __device__ static void gather_stage(const Sources& from, const GatheredTile& rows,
                                      const void* any_address, int k_index, Storage& smem, int stage, uint64_t* full,
                                      int thread) {
    const auto opaque = [](uint32_t word) {
      asm volatile("mov.b32 %0, %0;" : "+r"(word));  // the address made here, each stage: not hoisted and held
      return word;
    };
    const int local = from.rank - from.world.first_local_rank;  // this rank's ring
    const uint32_t sources = opaque(rows.sources);
    const uint8_t* const ring = from.bases.ring_codes[local];
    // Row j's copy of k tile `k_index`, its source's base from `home_base(source)`. A padding row's
    // names the ring's base and reads nothing. The offset and k_index add in 32 bits (both within
    // the buffer).
    const auto copy_with = [&](auto home_base) {
      return [&, home_base](int j) {
        const uint32_t source = (sources >> (3 * j)) & kSourceMask;
        const uint8_t* const base = source >= kPaddingSource ? ring : home_base(source);
        return gemm::UnitCopy{base + (opaque(rows.offset[j]) + uint32_t(k_index)), source == kPaddingSource ? 0u : 16u};
      };
    };
    // Row `thread`'s block-0 scale and the distance between its K blocks' (nullptr: a padding row).
    const uint32_t scale_source = sources >> kScaleSourceShift;
    const int64_t scale_row = opaque(rows.scale_row);
    const float* scale = nullptr;
    int scale_block_stride = 0;
    if (scale_source == kRingSource) {
      scale = from.bases.ring_scales[local] + scale_row;
      scale_block_stride = from.pull.scale_stride;
    } else if (scale_source != kPaddingSource) {
      scale = from.bases.home_scales[scale_source] + scale_row;
      scale_block_stride = from.pull.home_rows;
    }
    if (from.world.local_ranks == 1) {  // a process driving one GPU: two bases, in registers
      const uint8_t* const home = from.bases.home_codes[0];
      gemm::gather_fp8_stage<Policy::A>(copy_with([home](uint32_t) { return home; }), scale, scale_block_stride,
                                        any_address, k_index, smem.a[stage], smem.scales_a[stage], full, thread);
    } else {
      gemm::gather_fp8_stage<Policy::A>(
          copy_with([&from](uint32_t source) { return from.bases.home_codes[source]; }), scale, scale_block_stride,
          any_address, k_index, smem.a[stage], smem.scales_a[stage], full, thread);
    }
  }
};

template <class Gemms>
inline constexpr bool kForwardGemmsShareRing =
    std::is_same_v<typename Gemms::UpGate::Policy, typename Gemms::Down::Policy> &&
    std::is_same_v<typename Gemms::UpGate::OperandA, typename Gemms::Down::OperandA> &&
    Gemms::Policy::kBlockN == gemm::kBlockN;  // the task cursor's tiles (forward_tasks.cuh)
static_assert(kForwardGemmsShareRing<Bf16ForwardGemms> && kForwardGemmsShareRing<Fp8ForwardGemms>,
              "a forward's GEMMs share the CTA's stage ring, their A rows load alike, their tiles are the cursor's");
static_assert(gemm::fits_launch_registers({Bf16ForwardGemms::kProducerRegisters, Bf16ForwardGemms::kConsumerRegisters}) &&
                  gemm::fits_launch_registers({Fp8ForwardGemms::kProducerRegisters, Fp8ForwardGemms::kConsumerRegisters}),
              "the fused forwards' setmaxnreg budgets fit the launch's registers (gemm_config.cuh)");

}  // namespace caracal::fused
