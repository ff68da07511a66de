#include "gemm/tensor_map.hpp"

#include <cuda_runtime.h>
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled_v12000

#include "caracal/error.hpp"
#include "caracal/gemm/grouped_gemm.hpp"

namespace caracal::gemm {
namespace {

constexpr uint64_t kF32Bytes = 4;

uint64_t element_bytes(TensorElement element) { return element == TensorElement::kE4m3 ? 1 : 2; }
CUtensorMapDataType data_type(TensorElement element) {
  return element == TensorElement::kE4m3 ? CU_TENSOR_MAP_DATA_TYPE_UINT8 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
}

PFN_cuTensorMapEncodeTiled_v12000 encode_function() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult status{};
    cudaError_t const err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000,
                                                             cudaEnableDefault, &status);
    CARACAL_CHECK(err == cudaSuccess && status == cudaDriverEntryPointSuccess && ptr != nullptr,
                  "grouped GEMM: cannot find the driver's cuTensorMapEncodeTiled (",
                  cudaGetErrorString(err), ")");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(ptr);
  }();
  return fn;
}

CUtensorMap encode(const void* base, uint32_t rank, const cuuint64_t* dims,
                   const cuuint64_t* strides, const cuuint32_t* box, const char* what,
                   CUtensorMapDataType type = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                   CUtensorMapSwizzle swizzle = CU_TENSOR_MAP_SWIZZLE_128B) {
  CUtensorMap map{};
  const cuuint32_t element_strides[5] = {1, 1, 1, 1, 1};
  CUresult const r = encode_function()(
      &map, type, rank, const_cast<void*>(base), dims, strides, box,
      element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  CARACAL_CHECK(r == CUDA_SUCCESS, "grouped GEMM: cuTensorMapEncodeTiled failed for ", what,
                " (CUresult ", int(r), ")");
  return map;
}

}  // namespace

CUtensorMap make_tensor_map_2d(const void* base, uint64_t rows, uint64_t cols, uint32_t box_rows,
                               uint32_t box_cols, const char* what, TensorElement element) {
  const cuuint64_t dims[2] = {cols, rows};
  const cuuint64_t strides[1] = {cols * element_bytes(element)};
  const cuuint32_t box[2] = {box_cols, box_rows};
  return encode(base, 2, dims, strides, box, what, data_type(element));
}

CUtensorMap make_f32_tensor_map_2d(const void* base, uint64_t rows, uint64_t cols, uint32_t box_rows,
                                   uint32_t box_cols, const char* what) {
  const cuuint64_t dims[2] = {cols, rows};
  const cuuint64_t strides[1] = {cols * kF32Bytes};
  const cuuint32_t box[2] = {box_cols, box_rows};
  return encode(base, 2, dims, strides, box, what, CU_TENSOR_MAP_DATA_TYPE_FLOAT32);
}

CUtensorMap make_tensor_map_3d(const void* base, uint64_t batch, uint64_t rows, uint64_t cols,
                               uint32_t box_rows, uint32_t box_cols, const char* what, TensorElement element) {
  const uint64_t bytes = element_bytes(element);
  const cuuint64_t dims[3] = {cols, rows, batch};
  const cuuint64_t strides[2] = {cols * bytes, rows * cols * bytes};
  const cuuint32_t box[3] = {box_cols, box_rows, 1};
  return encode(base, 3, dims, strides, box, what, data_type(element));
}

CUtensorMap make_scale_map_2d(const void* base, uint64_t rows, uint64_t cols, uint32_t box_cols, const char* what) {
  const cuuint64_t dims[2] = {cols, rows};
  const cuuint64_t strides[1] = {cols * kF32Bytes};
  const cuuint32_t box[2] = {box_cols, 1};
  return encode(base, 2, dims, strides, box, what, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, CU_TENSOR_MAP_SWIZZLE_NONE);
}

CUtensorMap make_scale_map_3d(const void* base, uint64_t batch, uint64_t rows, uint64_t cols, uint32_t box_cols,
                              const char* what) {
  const cuuint64_t dims[3] = {cols, rows, batch};
  const cuuint64_t strides[2] = {cols * kF32Bytes, rows * cols * kF32Bytes};
  const cuuint32_t box[3] = {box_cols, 1, 1};
  return encode(base, 3, dims, strides, box, what, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, CU_TENSOR_MAP_SWIZZLE_NONE);
}

namespace {

// The gate/up view of make_gate_up_view_map for elements of `bytes` bytes of type `type`.
CUtensorMap gate_up_view(const void* base, uint64_t experts, uint64_t intermediate, uint64_t cols, GateUpLayout layout,
                         uint32_t box_groups, uint32_t box_cols, const char* what, uint64_t bytes,
                         CUtensorMapDataType type) {
  constexpr uint32_t kGroup = kGateUpInterleave;  // rows of a gate or up group
  CARACAL_CHECK(intermediate % kGroup == 0, "grouped GEMM: ", what,
                ": the intermediate size must be a multiple of ", kGroup, " for the gate/up view, got ", intermediate);
  const uint64_t row = cols * bytes;  // bytes of a matrix row
  // (col, r, h, q, expert): row (q, h, r) of the interleaved order at 16 q + 8 h + r or h I + 8 q + r.
  const bool interleaved = layout == GateUpLayout::kInterleaved;
  const cuuint64_t dims[5] = {cols, kGroup, 2, intermediate / kGroup, experts};
  const cuuint64_t strides[4] = {row, (interleaved ? kGroup : intermediate) * row,
                                 (interleaved ? 2 * kGroup : kGroup) * row, 2 * intermediate * row};
  const cuuint32_t box[5] = {box_cols, kGroup, 2, box_groups, 1};
  return encode(base, 5, dims, strides, box, what, type);
}

}  // namespace

CUtensorMap make_gate_up_view_map(const void* base, uint64_t experts, uint64_t intermediate, uint64_t cols,
                                  GateUpLayout layout, uint32_t box_groups, uint32_t box_cols, const char* what) {
  return gate_up_view(base, experts, intermediate, cols, layout, box_groups, box_cols, what, 2,
                      CU_TENSOR_MAP_DATA_TYPE_BFLOAT16);
}

CUtensorMap make_f32_gate_up_view_map(const void* base, uint64_t experts, uint64_t intermediate, uint64_t cols,
                                      GateUpLayout layout, uint32_t box_groups, uint32_t box_cols, const char* what) {
  return gate_up_view(base, experts, intermediate, cols, layout, box_groups, box_cols, what, kF32Bytes,
                      CU_TENSOR_MAP_DATA_TYPE_FLOAT32);
}

}  // namespace caracal::gemm
