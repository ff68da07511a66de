#pragma once
// The CUTLASS backward baselines of cutlass_backward_gemms.hpp, built from CUTLASS's collective
// builders as its examples 57 (bf16) and 68 (FP8 blockwise scaling) build theirs, with each group's
// operands given by pointer and leading dimension (the weight gradients' operands are a window of
// longer rows). Include from one .cu per instantiation only: each compiles for minutes.
#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/detail/blockwise_scale_layout.hpp>
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

#include "caracal/comm/cuda_memory.hpp"
#include "caracal/error.hpp"
#include "cutlass_adapter.cuh"
#include "cutlass_backward_gemms.hpp"
#include "cutlass_grouped_gemm.cuh"

namespace caracal::bench::cutlass_backward {

using namespace cute;
using cutlass_baseline::upload;

using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;  // (M, N, K) per group
using Shape3 = ProblemShape::UnderlyingProblemShape;

// 16-bit operands: the forward baselines' schedules (cutlass_grouped_gemm.cuh), cooperative at
// Caracal's row-tile shape (128 x 256, no cluster) and example 57's ping-pong (128 x 128 a
// warpgroup, clusters of 2 x 1).
using Bf16Cooperative = cutlass_baseline::CooperativeOurTileSchedule;
using Bf16Pingpong = cutlass_baseline::PingpongSchedule;
// 8-bit operands with blockwise scales: example 68's cooperative (128 x 128 x 128, clusters of
// 1 x 2) and ping-pong at 64 x 128 x 128 a warpgroup, no cluster (its sparse-groups variant's
// 128 x 128 spills 1,260 bytes a thread: the promotion keeps a second set of accumulators).
struct Fp8Cooperative {
  using KernelSchedule = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise;
  using EpilogueSchedule = cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative;
  using TileShape = Shape<_128, _128, _128>;
  using ClusterShape = Shape<_1, _2, _1>;
};
struct Fp8Pingpong {
  using KernelSchedule = cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpongFP8Blockwise;
  using EpilogueSchedule = cutlass::epilogue::PtrArrayTmaWarpSpecializedPingpong;
  using TileShape = Shape<_64, _128, _128>;
  using ClusterShape = Shape<_1, _1, _1>;
};

// A packed stride with its one dynamic leading dimension set to `ld` (elements between rows of a
// row-major operand, columns of a column-major one).
template <class Stride>
Stride strided(int rows, int cols, int64_t ld) {
  Stride s = cutlass::make_cute_packed_stride(Stride{}, {rows, cols, 1});
  if constexpr (cute::is_static_v<decltype(cute::get<0>(s))>) {
    cute::get<1>(s) = ld;
  } else {
    cute::get<0>(s) = ld;
  }
  return s;
}

// One group's operands: (M, N, K), pointers and leading dimensions (null pointers: skipped, M = 0).
template <class ElementAB, class ElementD>
struct Group {
  int m = 0, n = 0, k = 0;
  const ElementAB* a = nullptr;
  int64_t lda = 0;
  const ElementAB* b = nullptr;
  int64_t ldb = 0;
  ElementD* d = nullptr;
  int64_t ldd = 0;
  const float* sfa = nullptr;  // FP8 only
  const float* sfb = nullptr;
};

// The per-group arrays every ptr-array GEMM takes, on the device.
template <class Gemm, class ElementAB, class ElementD>
struct GroupArrays {
  using StrideA = typename Gemm::GemmKernel::InternalStrideA;
  using StrideB = typename Gemm::GemmKernel::InternalStrideB;
  using StrideD = typename Gemm::GemmKernel::InternalStrideD;

  explicit GroupArrays(const std::vector<Group<ElementAB, ElementD>>& groups) {
    std::vector<const ElementAB*> a, b;
    std::vector<ElementD*> d;
    std::vector<StrideA> sa;
    std::vector<StrideB> sb;
    std::vector<StrideD> sd;
    for (const auto& g : groups) {
      shapes.push_back({g.m, g.n, g.k});
      a.push_back(g.a);
      b.push_back(g.b);
      d.push_back(g.d);
      sa.push_back(strided<StrideA>(g.m, g.k, g.lda));
      sb.push_back(strided<StrideB>(g.n, g.k, g.ldb));
      sd.push_back(strided<StrideD>(g.m, g.n, g.ldd));
    }
    shapes_device = upload(shapes, "CUTLASS backward baseline: problem shapes");
    a_pointers = upload(a, "CUTLASS backward baseline: A pointers");
    b_pointers = upload(b, "CUTLASS backward baseline: B pointers");
    d_pointers = upload(d, "CUTLASS backward baseline: D pointers");
    stride_a = upload(sa, "CUTLASS backward baseline: A strides");
    stride_b = upload(sb, "CUTLASS backward baseline: B strides");
    stride_d = upload(sd, "CUTLASS backward baseline: D strides");
  }
  std::vector<Shape3> shapes;  // host copy: CUTLASS reads it when setting up
  comm::DeviceMemory<Shape3> shapes_device;
  comm::DeviceMemory<const ElementAB*> a_pointers, b_pointers;
  comm::DeviceMemory<ElementD*> d_pointers;
  comm::DeviceMemory<StrideA> stride_a;
  comm::DeviceMemory<StrideB> stride_b;
  comm::DeviceMemory<StrideD> stride_d;
};

// bf16 operands of the given majorness, fp32 accumulation, D in ElementD (the product, rounded once).
template <class Schedule, class LayoutA, class LayoutB, class ElementD>
class Bf16Runner final : public CutlassGroupedGemm {
  using Element = cutlass::bfloat16_t;
  using LayoutD = cutlass::layout::RowMajor;
  static constexpr int kAlignmentAB = 8;                       // 16 bytes
  static constexpr int kAlignmentD = 16 / int(sizeof(ElementD));
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, typename Schedule::TileShape,
      typename Schedule::ClusterShape, cutlass::epilogue::collective::EpilogueTileAuto, float, float, ElementD,
      LayoutD*, kAlignmentD, ElementD, LayoutD*, kAlignmentD, typename Schedule::EpilogueSchedule,
      cutlass::epilogue::fusion::LinearCombination<ElementD, float>>::CollectiveOp;
  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, LayoutA*, kAlignmentAB, Element, LayoutB*,
      kAlignmentAB, float, typename Schedule::TileShape, typename Schedule::ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      typename Schedule::KernelSchedule>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using Adapter = cutlass_baseline::CutlassAdapter<Gemm>;

 public:
  using GroupOf = Group<Element, ElementD>;

  explicit Bf16Runner(const std::vector<GroupOf>& groups) : arrays_(groups) {
    const ElementD** c = const_cast<const ElementD**>(arrays_.d_pointers.get());
    const typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGrouped,
        {static_cast<int>(groups.size()), arrays_.shapes_device.get(), arrays_.shapes.data()},
        {arrays_.a_pointers.get(), arrays_.stride_a.get(), arrays_.b_pointers.get(), arrays_.stride_b.get()},
        {Adapter::plain_product(), c, arrays_.stride_d.get(), arrays_.d_pointers.get(), arrays_.stride_d.get()},
        Adapter::hardware()};
    gemm_.initialize(args, groups.empty() ? 0 : groups[0].n, groups.empty() ? 0 : groups[0].k,
                     "CUTLASS backward baseline");
  }

  void run(cudaStream_t stream) override { gemm_.run(stream, "CUTLASS backward baseline"); }

 private:
  GroupArrays<Gemm, Element, ElementD> arrays_;
  Adapter gemm_;
};

// e4m3 operands, both K-major, scaled per (MN index, 128-long K block) (ScaleConfig 1 x 1 x 128,
// MN-major scales); fp32 D.
template <class Schedule>
class Fp8WeightGradRunner final : public CutlassGroupedGemm {
  using Element = cutlass::float_e4m3_t;
  using LayoutA = cutlass::layout::RowMajor;     // [M][K]
  using LayoutB = cutlass::layout::ColumnMajor;  // [N][K]
  using LayoutD = cutlass::layout::RowMajor;
  static constexpr int kAlignmentAB = 16;
  static constexpr int kAlignmentD = 4;
  using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<1, 1, 128>;
  using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
  using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, typename Schedule::TileShape,
      typename Schedule::ClusterShape, cutlass::epilogue::collective::EpilogueTileAuto, float, float, float, LayoutD*,
      kAlignmentD, float, LayoutD*, kAlignmentD, typename Schedule::EpilogueSchedule,
      cutlass::epilogue::fusion::LinearCombination<float, float>>::CollectiveOp;
  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, cute::tuple<LayoutA*, LayoutSFA*>, kAlignmentAB,
      Element, cute::tuple<LayoutB*, LayoutSFB*>, kAlignmentAB, float, typename Schedule::TileShape,
      typename Schedule::ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      typename Schedule::KernelSchedule>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using Adapter = cutlass_baseline::CutlassAdapter<Gemm>;

 public:
  using GroupOf = Group<Element, float>;

  explicit Fp8WeightGradRunner(const std::vector<GroupOf>& groups) : arrays_(groups) {
    std::vector<const float*> sfa, sfb;
    std::vector<LayoutSFA> layout_sfa;
    std::vector<LayoutSFB> layout_sfb;
    for (const GroupOf& g : groups) {
      sfa.push_back(g.sfa);
      sfb.push_back(g.sfb);
      layout_sfa.push_back(ScaleConfig::tile_atom_to_shape_SFA(make_shape(g.m, g.n, g.k, 1)));
      layout_sfb.push_back(ScaleConfig::tile_atom_to_shape_SFB(make_shape(g.m, g.n, g.k, 1)));
    }
    sfa_ = upload(sfa, "CUTLASS FP8 weight gradients: SFA pointers");
    sfb_ = upload(sfb, "CUTLASS FP8 weight gradients: SFB pointers");
    layout_sfa_ = upload(layout_sfa, "CUTLASS FP8 weight gradients: SFA layouts");
    layout_sfb_ = upload(layout_sfb, "CUTLASS FP8 weight gradients: SFB layouts");
    const float** c = const_cast<const float**>(arrays_.d_pointers.get());
    const typename Gemm::Arguments args{
        cutlass::gemm::GemmUniversalMode::kGrouped,
        {static_cast<int>(groups.size()), arrays_.shapes_device.get(), arrays_.shapes.data()},
        {arrays_.a_pointers.get(), arrays_.stride_a.get(), arrays_.b_pointers.get(), arrays_.stride_b.get(), sfa_.get(),
         layout_sfa_.get(), sfb_.get(), layout_sfb_.get()},
        {Adapter::plain_product(), c, arrays_.stride_d.get(), arrays_.d_pointers.get(), arrays_.stride_d.get()},
        Adapter::hardware()};
    gemm_.initialize(args, groups.empty() ? 0 : groups[0].n, groups.empty() ? 0 : groups[0].k,
                     "CUTLASS FP8 weight gradients");
  }

  void run(cudaStream_t stream) override { gemm_.run(stream, "CUTLASS FP8 weight gradients"); }

 private:
  GroupArrays<Gemm, Element, float> arrays_;
  comm::DeviceMemory<const float*> sfa_, sfb_;
  comm::DeviceMemory<LayoutSFA> layout_sfa_;
  comm::DeviceMemory<LayoutSFB> layout_sfb_;
  Adapter gemm_;
};

// The groups of each problem of cutlass_backward_gemms.hpp (an expert without rows: M = 0, no tiles).
template <class Element>
std::vector<Group<Element, Element>> row_gemm_groups(const CutlassRowGemmProblem& p) {
  std::vector<Group<Element, Element>> groups;
  const auto* a = reinterpret_cast<const Element*>(p.a);
  const auto* b = reinterpret_cast<const Element*>(p.b);
  auto* d = reinterpret_cast<Element*>(p.d);
  for (size_t e = 0; e < p.experts.rows.size(); ++e) {
    Group<Element, Element> g;
    g.n = p.n;
    g.k = p.k;
    g.lda = p.k;
    g.ldb = p.n;
    g.ldd = p.n;
    if (p.experts.rows[e] > 0) {
      g.m = static_cast<int>(p.experts.rows[e]);
      g.a = a + p.experts.row_begin[e] * p.k;
      g.b = b + static_cast<int64_t>(e) * p.k * p.n;
      g.d = d + p.experts.row_begin[e] * p.n;
    }
    groups.push_back(g);
  }
  return groups;
}

template <class Element>
std::vector<Group<Element, float>> weight_grad_groups(const CutlassWeightGradProblem& p) {
  std::vector<Group<Element, float>> groups;
  const auto* lhs = reinterpret_cast<const Element*>(p.lhs);
  const auto* rhs = reinterpret_cast<const Element*>(p.rhs);
  for (size_t e = 0; e < p.experts.rows.size(); ++e) {
    Group<Element, float> g;
    g.n = p.n;
    g.k = 128;
    g.lda = p.m;
    g.ldb = p.n;
    g.ldd = p.n;
    if (p.experts.rows[e] > 0) {
      g.m = p.m;
      g.k = static_cast<int>(p.experts.rows[e]);
      g.a = lhs + p.experts.row_begin[e] * p.m;
      g.b = rhs + p.experts.row_begin[e] * p.n;
      g.d = p.d + static_cast<int64_t>(e) * p.m * p.n;
    }
    groups.push_back(g);
  }
  return groups;
}

template <class Element>
std::vector<Group<Element, float>> fp8_weight_grad_groups(const CutlassFp8WeightGradProblem& p) {
  std::vector<Group<Element, float>> groups;
  const auto* lhs = reinterpret_cast<const Element*>(p.lhs);
  const auto* rhs = reinterpret_cast<const Element*>(p.rhs);
  for (size_t e = 0; e < p.experts.rows.size(); ++e) {
    Group<Element, float> g;
    g.n = p.n;
    g.k = 128;
    g.lda = p.capacity;
    g.ldb = p.capacity;
    g.ldd = p.n;
    if (p.experts.rows[e] > 0) {
      const int64_t first = p.experts.row_begin[e];
      g.m = p.m;
      g.k = static_cast<int>((p.experts.rows[e] + 127) / 128 * 128);  // its padding rows hold zeros
      g.a = lhs + first;
      g.b = rhs + first;
      g.sfa = p.lhs_scales + first / 128 * p.m;
      g.sfb = p.rhs_scales + first / 128 * p.n;
      g.d = p.d + static_cast<int64_t>(e) * p.m * p.n;
    }
    groups.push_back(g);
  }
  return groups;
}

}  // namespace caracal::bench::cutlass_backward
