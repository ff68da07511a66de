// Forward down projection on CUTLASS's SM90 grouped GEMM (the only kernel instantiated in this
// unit): the ptr-array cooperative kernel (TMA, two consumer warpgroups on a 256 x 128 tile,
// clusters of 1 x 2) with the problem shapes read on the device, so the host never learns the
// counts. A small kernel first turns the schedule view into per-expert problems:
//   expert e: M = its padded segment (clipped to row_capacity), N = D, K = I,
//             A = activation rows of the segment, B = W_down[e] ([D][I]: column-major K x N),
//             D = the same rows of y_out.
// Padding rows hold zeros, so their outputs are zeros as the contract asks. Each output tile is
// computed by one CTA over K in order (no split K): bitwise identical across runs and grid sizes,
// and to the hand-built kernel's (caracal_gemm_bench compares them).
#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/gemm/group_array_problem_shape.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/util/packed_stride.hpp>

#include <algorithm>
#include <cstdint>

#include "caracal/comm/cuda_check.hpp"
#include "caracal/error.hpp"
#include "gemm/cutlass_down_proj.hpp"

namespace caracal::gemm {
namespace {

using namespace cute;

using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;  // (M, N, K) per expert
using Shape3 = ProblemShape::UnderlyingProblemShape;
using Element = cutlass::bfloat16_t;
using LayoutA = cutlass::layout::RowMajor;     // activation rows [M][I]
using LayoutB = cutlass::layout::ColumnMajor;  // W_down[e] [D][I]: K x N, K contiguous
using LayoutD = cutlass::layout::RowMajor;     // y rows [M][D]
constexpr int kAlignment = 8;                  // 16 bytes of bf16
using TileShape = Shape<_256, _128, _64>;
using ClusterShape = Shape<_1, _2, _1>;

using CollectiveEpilogue = cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float, Element, LayoutD*, kAlignment, Element, LayoutD*,
    kAlignment, cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
    cutlass::epilogue::fusion::LinearCombination<Element, float>>::CollectiveOp;
using CollectiveMainloop = cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, LayoutA*, kAlignment, Element, LayoutB*, kAlignment,
    float, TileShape, ClusterShape,
    cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>,
    cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>::CollectiveOp;
using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, CollectiveMainloop, CollectiveEpilogue>;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
using StrideA = Gemm::GemmKernel::InternalStrideA;
using StrideB = Gemm::GemmKernel::InternalStrideB;
using StrideD = Gemm::GemmKernel::InternalStrideD;

constexpr int kMaxSms = 256;  // the workspace holds per-SM TMA descriptors for at most this many SMs
constexpr size_t kAlign = 256;

size_t round_up(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// The per-expert arrays CUTLASS reads, carved from the front of the workspace.
struct ExpertArrays {
  Shape3* shapes;
  const Element** a;
  const Element** b;
  Element** d;
  StrideA* stride_a;
  StrideB* stride_b;
  StrideD* stride_d;
  void* cutlass_workspace;
};

template <typename T>
T* carve(uintptr_t& cursor, int count) {
  T* p = reinterpret_cast<T*>(cursor);
  cursor += round_up(sizeof(T) * size_t(count));
  return p;
}

// The arrays at the front of `workspace` (from address 0: their size), CUTLASS's workspace after.
ExpertArrays carve_arrays(uintptr_t workspace, int experts) {
  uintptr_t cursor = workspace;
  ExpertArrays arrays;
  arrays.shapes = carve<Shape3>(cursor, experts);
  arrays.a = carve<const Element*>(cursor, experts);
  arrays.b = carve<const Element*>(cursor, experts);
  arrays.d = carve<Element*>(cursor, experts);
  arrays.stride_a = carve<StrideA>(cursor, experts);
  arrays.stride_b = carve<StrideB>(cursor, experts);
  arrays.stride_d = carve<StrideD>(cursor, experts);
  arrays.cutlass_workspace = reinterpret_cast<void*>(cursor);
  return arrays;
}

// One thread per expert: its problem, operands and strides from the schedule view.
__global__ void prepare_down_problems(ScheduleView rows, int hidden, int intermediate, const Element* activation,
                                      const Element* w_down, Element* y, ExpertArrays arrays, StrideA stride_a,
                                      StrideB stride_b, StrideD stride_d) {
  const int e = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (e >= rows.num_experts) return;
  const int begin = min(max(rows.expert_offset[e], 0), rows.row_capacity);
  const int end = min(max(rows.expert_offset[e + 1], begin), rows.row_capacity);
  arrays.shapes[e] = Shape3{end - begin, hidden, intermediate};
  arrays.a[e] = activation + int64_t(begin) * intermediate;
  arrays.b[e] = w_down + int64_t(e) * hidden * intermediate;
  arrays.d[e] = y + int64_t(begin) * hidden;
  arrays.stride_a[e] = stride_a;
  arrays.stride_b[e] = stride_b;
  arrays.stride_d[e] = stride_d;
}

Gemm::Arguments gemm_arguments(const ExpertArrays& arrays, int experts, int sm_count, int device) {
  Gemm::Arguments args;
  decltype(args.epilogue.thread) fusion;
  fusion.alpha = 1.0f;
  fusion.beta = 0.0f;  // C is never read
  fusion.alpha_ptr = nullptr;
  fusion.beta_ptr = nullptr;
  fusion.alpha_ptr_array = nullptr;
  fusion.beta_ptr_array = nullptr;
  fusion.dAlpha = {_0{}, _0{}, 0};
  fusion.dBeta = {_0{}, _0{}, 0};
  cutlass::KernelHardwareInfo hw;
  hw.device_id = device;
  hw.sm_count = sm_count;
  args = Gemm::Arguments{cutlass::gemm::GemmUniversalMode::kGrouped,
                         {experts, arrays.shapes, nullptr},  // problem shapes on the device only
                         {arrays.a, arrays.stride_a, arrays.b, arrays.stride_b},
                         {fusion, const_cast<const Element**>(arrays.d), arrays.stride_d, arrays.d, arrays.stride_d},
                         hw};
  return args;
}

}  // namespace

size_t cutlass_down_proj_workspace_bytes(int num_experts) {
  if (num_experts <= 0) return 0;
  const ExpertArrays sizes = carve_arrays(0, num_experts);
  const size_t arrays_bytes = reinterpret_cast<uintptr_t>(sizes.cutlass_workspace);
  return arrays_bytes + round_up(Gemm::get_workspace_size(gemm_arguments(sizes, num_experts, kMaxSms, 0)));
}

void cutlass_down_proj(const DownProjArgs& args, cudaStream_t stream) {
  const char* fn = "grouped_down_proj";
  const int experts = args.rows.num_experts;
  int device = 0, sms = 0;
  check_cuda(cudaGetDevice(&device), "grouped_down_proj: cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
             "grouped_down_proj: cudaDeviceGetAttribute(MultiProcessorCount)");
  // Persistent CTAs: num_ctas (0: one per SM), at least one cluster of 2.
  const int sm_count = std::max(std::min({args.num_ctas > 0 ? args.num_ctas : sms, sms, kMaxSms}), 2);

  const ExpertArrays arrays = carve_arrays(reinterpret_cast<uintptr_t>(args.workspace), experts);
  const StrideA stride_a = cutlass::make_cute_packed_stride(StrideA{}, {1, args.intermediate, 1});
  const StrideB stride_b = cutlass::make_cute_packed_stride(StrideB{}, {args.hidden, args.intermediate, 1});
  const StrideD stride_d = cutlass::make_cute_packed_stride(StrideD{}, {1, args.hidden, 1});
  constexpr int kThreads = 128;
  prepare_down_problems<<<(experts + kThreads - 1) / kThreads, kThreads, 0, stream>>>(
      args.rows, args.hidden, args.intermediate, reinterpret_cast<const Element*>(args.activation),
      reinterpret_cast<const Element*>(args.w_down), reinterpret_cast<Element*>(args.y_out), arrays, stride_a,
      stride_b, stride_d);
  check_cuda(cudaGetLastError(), "grouped_down_proj: problem preparation launch");

  Gemm gemm;
  const Gemm::Arguments gemm_args = gemm_arguments(arrays, experts, sm_count, device);
  cutlass::Status status = gemm.can_implement(gemm_args);
  CARACAL_CHECK(status == cutlass::Status::kSuccess, fn, ": CUTLASS cannot implement D = ", args.hidden,
                ", I = ", args.intermediate, ": ", cutlassGetStatusString(status));
  status = gemm.initialize(gemm_args, arrays.cutlass_workspace, stream);
  CARACAL_CHECK(status == cutlass::Status::kSuccess, fn, ": CUTLASS initialize failed: ", cutlassGetStatusString(status));
  status = gemm.run(stream);
  CARACAL_CHECK(status == cutlass::Status::kSuccess, fn, ": CUTLASS launch failed: ", cutlassGetStatusString(status));
  check_cuda(cudaGetLastError(), "grouped_down_proj: CUTLASS launch");
}

}  // namespace caracal::gemm
