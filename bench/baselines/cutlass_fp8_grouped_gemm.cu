// The CUTLASS FP8 blockwise-scaled grouped-GEMM baseline (cutlass_fp8_grouped_gemm.hpp), built from
// CUTLASS's collective builders as its example 68 builds it, with a bf16 row-major output.
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
#include "cutlass_fp8_grouped_gemm.hpp"

namespace caracal::bench {
namespace {

using namespace cute;
using cutlass_baseline::upload;

using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;  // (M, N, K) per group
using ElementAB = cutlass::float_e4m3_t;
using ElementD = cutlass::bfloat16_t;
using LayoutA = cutlass::layout::RowMajor;     // rows [M][K]
using LayoutB = cutlass::layout::ColumnMajor;  // weights [N][K]
using LayoutD = cutlass::layout::RowMajor;     // rows [M][N]
constexpr int kAlignmentAB = 16;               // 16 bytes of e4m3
constexpr int kAlignmentD = 8;                 // 16 bytes of bf16

using TileShape = Shape<_128, _128, _128>;
using ClusterShape = Shape<_1, _2, _1>;
using ScaleConfig = cutlass::detail::Sm90BlockwiseScaleConfig<1, 128, 128>;
using LayoutSFA = decltype(ScaleConfig::deduce_layoutSFA());
using LayoutSFB = decltype(ScaleConfig::deduce_layoutSFB());

using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float, ElementD, LayoutD*, kAlignmentD, ElementD, LayoutD*,
    kAlignmentD, cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
    cutlass::epilogue::fusion::LinearCombination<ElementD, float>>::CollectiveOp;
using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementAB, cute::tuple<LayoutA*, LayoutSFA*>, kAlignmentAB,
    ElementAB, cute::tuple<LayoutB*, LayoutSFB*>, kAlignmentAB, float, TileShape, ClusterShape,
    cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
    cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8Blockwise>::CollectiveOp;
using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

using StrideA = typename Gemm::GemmKernel::InternalStrideA;
using StrideB = typename Gemm::GemmKernel::InternalStrideB;
using StrideD = typename Gemm::GemmKernel::InternalStrideD;
using Shape3 = typename ProblemShape::UnderlyingProblemShape;

class Runner final : public CutlassGroupedGemm {
  using Adapter = cutlass_baseline::CutlassAdapter<Gemm>;

 public:
  explicit Runner(const CutlassFp8GroupedProblem& p) {
    const size_t groups = p.rows.size();
    CARACAL_CHECK(groups > 0 && p.row_begin.size() == groups && p.sfa_offset.size() == groups,
                  "CUTLASS FP8 baseline: row_begin, rows and sfa_offset must name the same groups, got ",
                  p.row_begin.size(), ", ", groups, " and ", p.sfa_offset.size());
    const int64_t k_blocks = (p.k + 127) / 128, n_blocks = (p.n + 127) / 128;
    std::vector<const ElementAB*> a(groups), b(groups);
    std::vector<const float*> sfa(groups), sfb(groups);
    std::vector<ElementD*> d(groups);
    std::vector<StrideA> stride_a(groups);
    std::vector<StrideB> stride_b(groups);
    std::vector<StrideD> stride_d(groups);
    std::vector<LayoutSFA> layout_sfa(groups);
    std::vector<LayoutSFB> layout_sfb(groups);
    for (size_t g = 0; g < groups; ++g) {
      const int m = static_cast<int>(p.rows[g]);
      shapes_.push_back({m, p.n, p.k});
      const bool empty = m == 0;
      a[g] = empty ? nullptr : reinterpret_cast<const ElementAB*>(p.a) + p.row_begin[g] * p.k;
      b[g] = empty ? nullptr : reinterpret_cast<const ElementAB*>(p.b) + static_cast<int64_t>(g) * p.n * p.k;
      d[g] = empty ? nullptr : reinterpret_cast<ElementD*>(p.d) + p.row_begin[g] * p.n;
      sfa[g] = empty ? nullptr : p.sfa + p.sfa_offset[g];
      sfb[g] = empty ? nullptr : p.sfb + static_cast<int64_t>(g) * k_blocks * n_blocks;
      stride_a[g] = cutlass::make_cute_packed_stride(StrideA{}, {m, p.k, 1});
      stride_b[g] = cutlass::make_cute_packed_stride(StrideB{}, {p.n, p.k, 1});
      stride_d[g] = cutlass::make_cute_packed_stride(StrideD{}, {m, p.n, 1});
      layout_sfa[g] = ScaleConfig::tile_atom_to_shape_SFA(make_shape(m, p.n, p.k, 1));
      layout_sfb[g] = ScaleConfig::tile_atom_to_shape_SFB(make_shape(m, p.n, p.k, 1));
    }
    shapes_device_ = upload(shapes_, "CUTLASS FP8 baseline: problem shapes");
    a_ = upload(a, "CUTLASS FP8 baseline: A pointers");
    b_ = upload(b, "CUTLASS FP8 baseline: B pointers");
    sfa_ = upload(sfa, "CUTLASS FP8 baseline: SFA pointers");
    sfb_ = upload(sfb, "CUTLASS FP8 baseline: SFB pointers");
    d_ = upload(d, "CUTLASS FP8 baseline: D pointers");
    stride_a_ = upload(stride_a, "CUTLASS FP8 baseline: A strides");
    stride_b_ = upload(stride_b, "CUTLASS FP8 baseline: B strides");
    stride_d_ = upload(stride_d, "CUTLASS FP8 baseline: D strides");
    layout_sfa_ = upload(layout_sfa, "CUTLASS FP8 baseline: SFA layouts");
    layout_sfb_ = upload(layout_sfb, "CUTLASS FP8 baseline: SFB layouts");

    const ElementD** c = const_cast<const ElementD**>(d_.get());
    const Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGrouped,
                               {static_cast<int>(groups), shapes_device_.get(), shapes_.data()},
                               {a_.get(), stride_a_.get(), b_.get(), stride_b_.get(), sfa_.get(), layout_sfa_.get(),
                                sfb_.get(), layout_sfb_.get()},
                               {Adapter::plain_product(), c, stride_d_.get(), d_.get(), stride_d_.get()},
                               Adapter::hardware()};
    gemm_.initialize(args, p.n, p.k, "CUTLASS FP8 baseline");
  }

  void run(cudaStream_t stream) override { gemm_.run(stream, "CUTLASS FP8 baseline"); }

 private:
  std::vector<Shape3> shapes_;  // host copy: CUTLASS reads it when setting up
  comm::DeviceMemory<Shape3> shapes_device_;
  comm::DeviceMemory<const ElementAB*> a_, b_;
  comm::DeviceMemory<const float*> sfa_, sfb_;
  comm::DeviceMemory<ElementD*> d_;
  comm::DeviceMemory<StrideA> stride_a_;
  comm::DeviceMemory<StrideB> stride_b_;
  comm::DeviceMemory<StrideD> stride_d_;
  comm::DeviceMemory<LayoutSFA> layout_sfa_;
  comm::DeviceMemory<LayoutSFB> layout_sfb_;
  Adapter gemm_;
};

}  // namespace

std::unique_ptr<CutlassGroupedGemm> make_cutlass_fp8_blockwise(const CutlassFp8GroupedProblem& problem) {
  return std::make_unique<Runner>(problem);
}

}  // namespace caracal::bench
