#pragma once
// The launch of a fused kernel (fused_forward.hpp, fused_backward.hpp): every CTA a grouped-GEMM CTA
// (gemm::kThreads threads, the shared memory of its GEMMs' policy, `Policy`), one per SM shared by
// the local ranks, the first comm_ctas of each rank pulling before they compute.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "caracal/error.hpp"
#include "comm/launch.cuh"
#include "device/gemm/grouped_gemm_kernel.cuh"
#include "fused/fused_forward.hpp"

namespace caracal::fused {

// Spans of device words cut one after another from one allocation (a rank's readiness counters):
// with a null base only their words are counted (the spans are null).
class CounterArena {
 public:
  explicit CounterArena(uint32_t* base) : base_(base) {}
  uint32_t* take(size_t words) {
    uint32_t* const span = base_ != nullptr ? base_ + used_ : nullptr;
    used_ += words;
    return span;
  }
  size_t words() const { return used_; }

 private:
  uint32_t* base_;
  size_t used_ = 0;
};

// What follows a rank's `counter_words` readiness counters at `base` in its ready_counters: spans
// cut one after another, each from a 32-byte boundary (a task slot's size), the task slots first;
// with a null base only words() counts them (up to the boundary after the last span).
class RankWords {
 public:
  RankWords(uint32_t* base, size_t counter_words) : arena_(base) { arena_.take(counter_words); }
  template <class T>
  T* take(size_t count) {
    static_assert(sizeof(T) % sizeof(uint32_t) == 0 && alignof(T) <= kBoundaryWords * sizeof(uint32_t));
    arena_.take(padding());
    return reinterpret_cast<T*>(arena_.take(count * (sizeof(T) / sizeof(uint32_t))));
  }
  size_t words() const { return arena_.words() + padding(); }

 private:
  static constexpr size_t kBoundaryWords = 8;
  size_t padding() const { return (kBoundaryWords - arena_.words() % kBoundaryWords) % kBoundaryWords; }
  CounterArena arena_;
};

// Task slots of a launch: one per stage of its GEMMs' ring (`Stages`) for each of kFusedMaxCtasPerRank CTAs.
template <class Slot, int Stages>
Slot* take_task_slots(RankWords& words) {
  static_assert(sizeof(Slot) == 32, "a slot per 32-byte boundary");
  return words.take<Slot>(size_t(kFusedMaxCtasPerRank) * Stages);
}

// CTAs per rank of a launch of `kernel` on `world`'s device (one per SM, shared by the local ranks),
// its shared-memory limit raised to gemm::kSmemBytes<Policy> first.
template <class Policy, typename... Params>
int fused_kernel_ctas_per_rank(const comm::World& world, void (*kernel)(comm::DeviceWorld, Params...),
                               const char* name) {
  constexpr int kSmemBytes = gemm::kSmemBytes<Policy>;
  const cudaError_t attr = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  CARACAL_CHECK(attr == cudaSuccess, name, ": cannot raise the shared-memory limit to ", kSmemBytes,
                " bytes: ", cudaGetErrorString(attr));
  return comm::max_ctas_per_rank(world, kernel, gemm::kThreads, kSmemBytes);
}

// The shape of a launch of `ctas_per_rank` CTAs per rank (at most kFusedMaxCtasPerRank: the task
// slots the ready counters hold).
template <class Policy>
comm::LaunchShape fused_launch_shape(int ctas_per_rank, const char* name) {
  CARACAL_CHECK(ctas_per_rank <= kFusedMaxCtasPerRank, name, ": at most ", kFusedMaxCtasPerRank,
                " CTAs per rank (the task slots of its ready counters), got ", ctas_per_rank);
  comm::LaunchShape shape;
  shape.threads_per_cta = gemm::kThreads;
  shape.shared_bytes = gemm::kSmemBytes<Policy>;
  shape.ctas_per_rank = ctas_per_rank;
  return shape;
}

// `comm_ctas`, checked against the launch's CTAs per rank (one must compute).
inline int checked_comm_ctas(int comm_ctas, const comm::LaunchShape& shape, const char* name) {
  CARACAL_CHECK(comm_ctas >= 1 && comm_ctas < shape.ctas_per_rank, name, ": comm_ctas must be in [1, ",
                shape.ctas_per_rank - 1, "] (the launch has ", shape.ctas_per_rank,
                " CTAs per rank and needs one to compute), got ", comm_ctas);
  return comm_ctas;
}

}  // namespace caracal::fused
