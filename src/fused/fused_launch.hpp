#pragma once
// The launch of a fused kernel (fused_forward.hpp, fused_backward.hpp): every CTA a grouped-GEMM CTA
// (gemm::kThreads threads, gemm::kSmemBytes of shared memory), one per SM shared by the local ranks,
// the first comm_ctas of each rank pulling before they compute.
#include "caracal/error.hpp"
#include "device/comm/launch.cuh"
#include "device/gemm/grouped_gemm_kernel.cuh"
#include "fused/fused_forward.hpp"

namespace caracal::fused {

// The shape of a launch of `ctas_per_rank` CTAs per rank (at most kFusedMaxCtasPerRank: the task
// slots the ready counters hold).
inline comm::LaunchShape fused_launch_shape(int ctas_per_rank, const char* name) {
  CARACAL_CHECK(ctas_per_rank <= kFusedMaxCtasPerRank, name, ": at most ", kFusedMaxCtasPerRank,
                " CTAs per rank (the task slots of its ready counters), got ", ctas_per_rank);
  comm::LaunchShape shape;
  shape.threads_per_cta = gemm::kThreads;
  shape.shared_bytes = gemm::kSmemBytes;
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
