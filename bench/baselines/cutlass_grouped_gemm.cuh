#pragma once
// The CUTLASS grouped-GEMM baseline for one schedule (cutlass_grouped_gemm.hpp): built from
// CUTLASS's collective builders exactly as its example 57 builds it, with bf16 operands. Include
// from one .cu per schedule only: each instantiation compiles for minutes.
#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/gemm/group_array_problem_shape.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/util/packed_stride.hpp>

#include <cstdint>
#include <memory>
#include <vector>

#include "caracal/comm/cuda_check.hpp"
#include "caracal/comm/cuda_memory.hpp"
#include "caracal/error.hpp"
#include "cutlass_adapter.cuh"
#include "cutlass_grouped_gemm.hpp"

namespace caracal::bench::cutlass_baseline {

using namespace cute;

using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;  // (M, N, K) per group
using Element = cutlass::bfloat16_t;
using LayoutA = cutlass::layout::RowMajor;     // rows [M][K]
using LayoutB = cutlass::layout::ColumnMajor;  // weights [N][K]
using LayoutD = cutlass::layout::RowMajor;     // rows [M][N]
inline constexpr int kAlignment = 8;           // 16 bytes of bf16

// The schedules of cutlass_grouped_gemm.hpp's CutlassSchedule, each instantiated by its own .cu:
// KernelSchedule, EpilogueSchedule, TileShape, ClusterShape (K tile 64 for 16-bit operands: one
// 128-byte swizzle row).
// Example 57's cooperative: both consumer warpgroups on one 256 x 128 tile, clusters of 1 x 2.
struct CooperativeSchedule {
  using KernelSchedule = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative;
  using EpilogueSchedule = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative;
  using TileShape = Shape<_256, _128, _64>;
  using ClusterShape = Shape<_1, _2, _1>;
};
// Example 57's ping-pong: each consumer warpgroup on its own 128 x 128 tile, one's epilogue under
// the other's mainloop, clusters of 2 x 1.
struct PingpongSchedule {
  using KernelSchedule = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong;
  using EpilogueSchedule = cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong;
  using TileShape = Shape<_128, _128, _64>;
  using ClusterShape = Shape<_2, _1, _1>;
};
// The cooperative schedule at Caracal's tile: 128 x 256 tiles without clusters, as Caracal's
// row-tile GEMMs are tiled.
struct CooperativeOurTileSchedule {
  using KernelSchedule = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative;
  using EpilogueSchedule = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative;
  using TileShape = Shape<_128, _256, _64>;
  using ClusterShape = Shape<_1, _1, _1>;
};

template <class Schedule>
struct GroupedGemm {
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, typename Schedule::TileShape,
      typename Schedule::ClusterShape, cutlass::epilogue::collective::EpilogueTileAuto, float, float, Element,
      LayoutD*, kAlignment, Element, LayoutD*, kAlignment, typename Schedule::EpilogueSchedule,
      cutlass::epilogue::fusion::LinearCombination<Element, float>>::CollectiveOp;
  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, LayoutA*, kAlignment, Element, LayoutB*,
      kAlignment, float, typename Schedule::TileShape, typename Schedule::ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      typename Schedule::KernelSchedule>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

template <class Schedule>
class Runner final : public CutlassGroupedGemm {
  using Gemm = typename GroupedGemm<Schedule>::Gemm;
  using Adapter = CutlassAdapter<Gemm>;
  using StrideA = typename Gemm::GemmKernel::InternalStrideA;
  using StrideB = typename Gemm::GemmKernel::InternalStrideB;
  using StrideD = typename Gemm::GemmKernel::InternalStrideD;
  using Shape3 = typename ProblemShape::UnderlyingProblemShape;

 public:
  explicit Runner(const CutlassGroupedProblem& p) {
    const size_t groups = p.rows.size();
    CARACAL_CHECK(groups > 0 && p.row_begin.size() == groups, "CUTLASS baseline: row_begin and rows must name the "
                  "same groups, got ", p.row_begin.size(), " and ", groups);
    std::vector<const Element*> a(groups), b(groups);
    std::vector<Element*> d(groups);
    std::vector<StrideA> stride_a(groups);
    std::vector<StrideB> stride_b(groups);
    std::vector<StrideD> stride_d(groups);
    for (size_t g = 0; g < groups; ++g) {
      const int m = static_cast<int>(p.rows[g]);
      shapes_.push_back({m, p.n, p.k});
      const bool empty = m == 0;
      a[g] = empty ? nullptr : reinterpret_cast<const Element*>(p.a) + p.row_begin[g] * p.k;
      b[g] = empty ? nullptr : reinterpret_cast<const Element*>(p.b) + static_cast<int64_t>(g) * p.n * p.k;
      d[g] = empty ? nullptr : reinterpret_cast<Element*>(p.d) + p.row_begin[g] * p.n;
      stride_a[g] = cutlass::make_cute_packed_stride(StrideA{}, {m, p.k, 1});
      stride_b[g] = cutlass::make_cute_packed_stride(StrideB{}, {p.n, p.k, 1});
      stride_d[g] = cutlass::make_cute_packed_stride(StrideD{}, {m, p.n, 1});
    }
    shapes_device_ = upload(shapes_, "CUTLASS baseline: problem shapes");
    a_ = upload(a, "CUTLASS baseline: A pointers");
    b_ = upload(b, "CUTLASS baseline: B pointers");
    d_ = upload(d, "CUTLASS baseline: D pointers");
    stride_a_ = upload(stride_a, "CUTLASS baseline: A strides");
    stride_b_ = upload(stride_b, "CUTLASS baseline: B strides");
    stride_d_ = upload(stride_d, "CUTLASS baseline: D strides");

    const Element** c = const_cast<const Element**>(d_.get());
    const typename Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGrouped,
                                        {static_cast<int>(groups), shapes_device_.get(), shapes_.data()},
                                        {a_.get(), stride_a_.get(), b_.get(), stride_b_.get()},
                                        {Adapter::plain_product(), c, stride_d_.get(), d_.get(), stride_d_.get()},
                                        Adapter::hardware()};
    gemm_.initialize(args, p.n, p.k, "CUTLASS baseline");
  }

  void run(cudaStream_t stream) override { gemm_.run(stream, "CUTLASS baseline"); }

 private:
  std::vector<Shape3> shapes_;  // host copy: CUTLASS reads it when setting up
  comm::DeviceMemory<Shape3> shapes_device_;
  comm::DeviceMemory<const Element*> a_, b_;
  comm::DeviceMemory<Element*> d_;
  comm::DeviceMemory<StrideA> stride_a_;
  comm::DeviceMemory<StrideB> stride_b_;
  comm::DeviceMemory<StrideD> stride_d_;
  Adapter gemm_;
};

}  // namespace caracal::bench::cutlass_baseline
