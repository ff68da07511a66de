#include "gemm/host_checks.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "caracal/error.hpp"
#include "device/gemm/tile_shape.hpp"

namespace caracal::gemm {
namespace {

bool aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

void check_dim(int value, const char* fn, const char* name, int alignment = kGroupedGemmDimAlignment) {
  CARACAL_CHECK(value > 0 && value % alignment == 0, fn, ": ", name, " must be a positive multiple of ", alignment,
                ", got ", value);
}

void check_rows(const ScheduleView& rows, const char* fn) {
  CARACAL_CHECK(rows.num_experts >= 1, fn, ": rows.num_experts must be >= 1, got ",
                rows.num_experts);
  CARACAL_CHECK(rows.row_capacity >= 0 && rows.row_capacity % kGroupedGemmTileM == 0, fn,
                ": rows.row_capacity must be a non-negative multiple of ", kGroupedGemmTileM,
                ", got ", rows.row_capacity);
  CARACAL_CHECK(rows.expert_offset != nullptr && aligned(rows.expert_offset, 4), fn,
                ": rows.expert_offset must be a 4-byte aligned device pointer to num_experts + 1 "
                "int32 offsets, got ",
                static_cast<const void*>(rows.expert_offset));
  CARACAL_CHECK(aligned(rows.expert_count, 4), fn,
                ": rows.expert_count must be null or a 4-byte aligned device pointer, got ",
                static_cast<const void*>(rows.expert_count));
  CARACAL_CHECK(rows.ring_rows >= 0 && rows.ring_rows % kGroupedGemmTileM == 0 && rows.ring_rows <= rows.row_capacity,
                fn, ": rows.ring_rows must be 0 or a multiple of ", kGroupedGemmTileM, " up to row_capacity = ",
                rows.row_capacity, ", got ", rows.ring_rows);
  CARACAL_CHECK(rows.first_row >= 0 && rows.first_row <= rows.row_capacity && rows.first_row % kGroupedGemmTileM == 0,
                fn, ": rows.first_row must be a multiple of ", kGroupedGemmTileM, " in [0, row_capacity = ",
                rows.row_capacity, "], got ", rows.first_row);
  CARACAL_CHECK(rows.end_row == 0 || (rows.end_row > rows.first_row && rows.end_row <= rows.row_capacity &&
                                      rows.end_row % kGroupedGemmTileM == 0),
                fn, ": rows.end_row must be 0 (no end) or a multiple of ", kGroupedGemmTileM, " in (first_row = ",
                rows.first_row, ", row_capacity = ", rows.row_capacity, "], got ", rows.end_row);
  if (rows.ring_rows > 0) {  // the window's rows must not wrap around the ring
    CARACAL_CHECK(rows.first_row % rows.ring_rows == 0 && rows.end_row > 0 &&
                      rows.end_row - rows.first_row <= rows.ring_rows,
                  fn, ": over a ring (rows.ring_rows = ", rows.ring_rows,
                  ") the window [first_row, end_row) must start at a multiple of ring_rows and hold at most "
                  "ring_rows rows, got [",
                  rows.first_row, ", ", rows.end_row, ")");
  }
}

// A matrix or fp32 array: non-null and 16-byte aligned (TMA boxes, vector stores), except row
// buffers of an empty capacity.
void check_pointer(const void* p, bool may_be_null, const char* fn, const char* name) {
  CARACAL_CHECK(may_be_null || p != nullptr, fn, ": ", name,
                " must be a 16-byte aligned device pointer, got null");
  CARACAL_CHECK(aligned(p, 16), fn, ": ", name, " must be 16-byte aligned, got ", p);
}

// A gradient output given in fp32 or in bf16: exactly one of the pair, 16-byte aligned.
void check_one_output(const void* f32, const void* bf16, const char* fn, const char* name) {
  CARACAL_CHECK((f32 != nullptr) != (bf16 != nullptr), fn, ": exactly one of ", name, " (fp32) and ", name,
                "_bf16 must be a 16-byte aligned device pointer, got ", f32 ? "both" : "null for both");
  const std::string bf16_name = std::string(name) + "_bf16";
  check_pointer(f32 ? f32 : bf16, false, fn, f32 ? name : bf16_name.c_str());
}

void check_num_ctas(int num_ctas, const char* fn) {
  CARACAL_CHECK(num_ctas >= 0, fn, ": num_ctas must be >= 0 (0: one per SM), got ", num_ctas);
}

// A tile queue is optional; given, it is 16-byte aligned and serves at most kTileQueueMaxCtas CTAs
// (num_ctas 0, one per SM, is checked again at launch).
void check_tile_queue(const uint32_t* queue, int num_ctas, const char* fn) {
  if (queue == nullptr) return;
  check_pointer(queue, false, fn, "tile_queue");
  CARACAL_CHECK(num_ctas <= kTileQueueMaxCtas, fn, ": num_ctas must be at most ", kTileQueueMaxCtas,
                " with a tile_queue, got ", num_ctas);
}

// Tile indices are 32-bit on the device (tiles of block_n columns).
void check_tile_count(const ScheduleView& rows, int64_t n, const char* fn, int64_t block_n = kBlockN) {
  int64_t const tiles =
      int64_t(rows.row_capacity / kGroupedGemmTileM) * ((n + block_n - 1) / block_n);
  CARACAL_CHECK(tiles < int64_t(std::numeric_limits<int32_t>::max()), fn,
                ": rows.row_capacity x N is too large (", tiles, " tiles, must be < 2^31)");
}

// Weight-gradient tiles (num_experts x ceil(M / 128) x ceil(N / block_n)) too.
void check_weight_tile_count(int num_experts, int64_t m, int64_t n, const char* fn, int64_t block_n = kBlockN) {
  int64_t const tiles = int64_t(num_experts) * ((m + kBlockM - 1) / kBlockM) *
                        ((n + block_n - 1) / block_n);
  CARACAL_CHECK(tiles < int64_t(std::numeric_limits<int32_t>::max()), fn,
                ": num_experts x M x N is too large (", tiles, " tiles of ", m, " x ", n,
                ", must be < 2^31)");
}

// An FP8 operand's codes and scales (`name`.codes, `name`.scales).
void check_fp8_pointers(const void* codes, const float* scales, bool may_be_null, const char* fn,
                        const std::string& name) {
  check_pointer(codes, may_be_null, fn, (name + ".codes").c_str());
  check_pointer(scales, may_be_null, fn, (name + ".scales").c_str());
}

// The FP8 GEMMs' tile N: 256 for the up/gate, down and dx GEMMs (Fp8BlockScaledWideGemmPolicy), 128
// for the dgrad (Fp8BlockScaledGemmPolicy).
constexpr int64_t kFp8WideBlockN = 256;
constexpr int64_t kFp8BlockN = 128;

// What every row-tile GEMM checks beside its pointers: its rows, D and I (multiples of
// `alignment`), the CTA count and tile queue, and that its tiles over N = `n` columns (in tiles of
// `block_n`) fit the device's 32-bit indices.
template <class Args>
void check_row_gemm(const Args& a, int64_t n, const char* fn, int alignment = kGroupedGemmDimAlignment,
                    int64_t block_n = kBlockN) {
  check_rows(a.rows, fn);
  check_dim(a.hidden, fn, "hidden (D)", alignment);
  check_dim(a.intermediate, fn, "intermediate (I)", alignment);
  check_num_ctas(a.num_ctas, fn);
  check_tile_queue(a.tile_queue, a.num_ctas, fn);
  check_tile_count(a.rows, n, fn, block_n);
}
template <class Args>
void check_fp8_row_gemm(const Args& a, int64_t n, const char* fn) {
  check_row_gemm(a, n, fn, kFp8GroupedGemmDimAlignment, kFp8WideBlockN);
}

}  // namespace

void check_up_gate_swiglu_args(const Fp8UpGateSwigluArgs& a) {
  const char* fn = "grouped_up_gate_swiglu (fp8)";
  check_fp8_row_gemm(a, 2 * int64_t(a.intermediate), fn);
  bool const no_rows = a.rows.row_capacity == 0;
  if (a.x_tokens.codes != nullptr || a.x_tokens.scales != nullptr) {  // x gathered from the tokens' rows
    CARACAL_CHECK(a.x.codes == nullptr && a.x.scales == nullptr, fn,
                  ": x and x_tokens are alternatives: x must be null when x_tokens is set");
    check_fp8_pointers(a.x_tokens.codes, a.x_tokens.scales, false, fn, "x_tokens");
    CARACAL_CHECK(no_rows || a.rows.rows != nullptr, fn, ": x_tokens needs rows.rows (each schedule row's route), got null");
    CARACAL_CHECK(a.top_k >= 1, fn, ": top_k must be >= 1 with x_tokens, got ", a.top_k);
    CARACAL_CHECK(a.x_tokens.scale_block_stride >= 1, fn,
                  ": x_tokens.scale_block_stride must be >= 1 (the tokens' rows), got ", a.x_tokens.scale_block_stride);
  } else {
    check_fp8_pointers(a.x.codes, a.x.scales, no_rows, fn, "x");
  }
  check_fp8_pointers(a.w_gate_up.codes, a.w_gate_up.scales, false, fn, "w_gate_up");
  bool const codes = a.activation_fp8_out.codes != nullptr || a.activation_fp8_out.scales != nullptr;
  CARACAL_CHECK(no_rows || codes || a.activation_out != nullptr, fn,
                ": activation_out or activation_fp8_out must be given (an activation to store), both are null");
  check_pointer(a.activation_out, true, fn, "activation_out");
  if (codes) check_fp8_pointers(a.activation_fp8_out.codes, a.activation_fp8_out.scales, false, fn, "activation_fp8_out");
  check_pointer(a.gate_up_out, true, fn, "gate_up_out");
}

void check_down_proj_args(const Fp8DownProjArgs& a) {
  const char* fn = "grouped_down_proj (fp8)";
  check_fp8_row_gemm(a, int64_t(a.hidden), fn);
  bool const no_rows = a.rows.row_capacity == 0;
  check_fp8_pointers(a.activation.codes, a.activation.scales, no_rows, fn, "activation");
  check_fp8_pointers(a.w_down.codes, a.w_down.scales, false, fn, "w_down");
  check_pointer(a.y_out, no_rows, fn, "y_out");
}

void check_down_dgrad_swiglu_args(const Fp8DownDgradSwigluArgs& a) {
  const char* fn = "grouped_down_dgrad_swiglu (fp8)";
  check_rows(a.rows, fn);
  check_dim(a.hidden, fn, "hidden (D)", kFp8GroupedGemmDimAlignment);
  check_dim(a.intermediate, fn, "intermediate (I)", kFp8GroupedGemmDimAlignment);
  bool const no_rows = a.rows.row_capacity == 0;
  check_fp8_pointers(a.dy.codes, a.dy.scales, no_rows, fn, "dy");
  check_fp8_pointers(a.w_down_t.codes, a.w_down_t.scales, false, fn, "w_down_t");
  check_pointer(a.gate_up, no_rows, fn, "gate_up");
  check_pointer(a.gates, no_rows, fn, "gates");
  check_pointer(a.d_gate_up_out, no_rows, fn, "d_gate_up_out");
  check_fp8_pointers(a.d_gate_up_fp8_out.codes, a.d_gate_up_fp8_out.scales, no_rows, fn, "d_gate_up_fp8_out");
  check_pointer(a.scaled_activation_out, no_rows, fn, "scaled_activation_out");
  check_pointer(a.d_gates_out, no_rows, fn, "d_gates_out");
  check_pointer(a.workspace, no_rows, fn, "workspace");
  check_num_ctas(a.num_ctas, fn);
  check_tile_queue(a.tile_queue, a.num_ctas, fn);
  check_tile_count(a.rows, a.intermediate, fn, kFp8BlockN);
}

void check_gate_up_dgrad_args(const Fp8GateUpDgradArgs& a, bool dx_stored, int block_n) {
  const char* fn = "grouped_gate_up_dgrad (fp8)";
  check_rows(a.rows, fn);
  check_dim(a.hidden, fn, "hidden (D)", kFp8GroupedGemmDimAlignment);
  check_dim(a.intermediate, fn, "intermediate (I)", kFp8GroupedGemmDimAlignment);
  bool const no_rows = a.rows.row_capacity == 0;
  check_fp8_pointers(a.d_gate_up.codes, a.d_gate_up.scales, no_rows, fn, "d_gate_up");
  check_fp8_pointers(a.w_gate_up_t.codes, a.w_gate_up_t.scales, false, fn, "w_gate_up_t");
  check_pointer(a.dx_out, no_rows || !dx_stored, fn, "dx_out");
  check_num_ctas(a.num_ctas, fn);
  check_tile_queue(a.tile_queue, a.num_ctas, fn);
  check_tile_count(a.rows, a.hidden, fn, block_n);
}

void check_weight_grads_args(const Fp8WeightGradArgs& a) {
  const char* fn = "grouped_weight_grads (fp8)";
  check_rows(a.rows, fn);
  CARACAL_CHECK(a.rows.ring_rows == 0 && a.rows.first_row == 0 && a.rows.end_row == 0, fn,
                ": FP8 weight gradients run over the whole schedule: rows.ring_rows, rows.first_row and "
                "rows.end_row must be 0, got ", a.rows.ring_rows, ", ", a.rows.first_row, " and ", a.rows.end_row);
  check_dim(a.hidden, fn, "hidden (D)", kFp8GroupedGemmDimAlignment);
  check_dim(a.intermediate, fn, "intermediate (I)", kFp8GroupedGemmDimAlignment);
  bool const no_rows = a.rows.row_capacity == 0;
  const std::pair<const Fp8ColumnOperand*, const char*> operands[] = {
      {&a.x, "x"}, {&a.dy, "dy"}, {&a.d_gate_up, "d_gate_up"}, {&a.scaled_activation, "scaled_activation"}};
  for (const auto& [operand, name] : operands) {
    check_pointer(operand->codes_t, no_rows, fn, (std::string(name) + ".codes_t").c_str());
    check_pointer(operand->scales, no_rows, fn, (std::string(name) + ".scales").c_str());
  }
  check_one_output(a.d_w_gate_up, a.d_w_gate_up_bf16, fn, "d_w_gate_up");
  check_one_output(a.d_w_down, a.d_w_down_bf16, fn, "d_w_down");
  check_num_ctas(a.num_ctas, fn);
  check_weight_tile_count(a.rows.num_experts, 2 * int64_t(a.intermediate), a.hidden, fn, kFp8BlockN);
  check_weight_tile_count(a.rows.num_experts, a.hidden, a.intermediate, fn, kFp8BlockN);
}

void check_up_gate_swiglu_args(const UpGateSwigluArgs& a) {
  const char* fn = "grouped_up_gate_swiglu";
  check_row_gemm(a, 2 * int64_t(a.intermediate), fn);
  bool const no_rows = a.rows.row_capacity == 0;
  check_pointer(a.x, no_rows, fn, "x");
  check_pointer(a.w_gate_up, false, fn, "w_gate_up");
  check_pointer(a.activation_out, no_rows, fn, "activation_out");
  check_pointer(a.gate_up_out, true, fn, "gate_up_out");
}

void check_down_proj_args(const DownProjArgs& a) {
  const char* fn = "grouped_down_proj";
  check_row_gemm(a, a.hidden, fn);
  bool const no_rows = a.rows.row_capacity == 0;
  check_pointer(a.activation, no_rows, fn, "activation");
  check_pointer(a.w_down, false, fn, "w_down");
  check_pointer(a.y_out, no_rows, fn, "y_out");
}

void check_down_dgrad_swiglu_args(const DownDgradSwigluArgs& a) {
  const char* fn = "grouped_down_dgrad_swiglu";
  check_row_gemm(a, a.intermediate, fn);
  bool const no_rows = a.rows.row_capacity == 0;
  check_pointer(a.dy, no_rows, fn, "dy");
  check_pointer(a.w_down, false, fn, "w_down");
  check_pointer(a.gate_up, no_rows, fn, "gate_up");
  check_pointer(a.gates, no_rows, fn, "gates");
  check_pointer(a.d_gate_up_out, no_rows, fn, "d_gate_up_out");
  check_pointer(a.scaled_activation_out, no_rows, fn, "scaled_activation_out");
  check_pointer(a.d_gates_out, no_rows, fn, "d_gates_out");
  check_pointer(a.workspace, no_rows, fn, "workspace");
}

void check_gate_up_dgrad_args(const GateUpDgradArgs& a, bool dx_stored) {
  const char* fn = "grouped_gate_up_dgrad";
  check_row_gemm(a, a.hidden, fn);
  bool const no_rows = a.rows.row_capacity == 0;
  check_pointer(a.d_gate_up, no_rows, fn, "d_gate_up");
  check_pointer(a.w_gate_up, false, fn, "w_gate_up");
  check_pointer(a.dx_out, no_rows || !dx_stored, fn, "dx_out");
}

void check_weight_grads_args(const WeightGradArgs& a) {
  const char* fn = "grouped_weight_grads";
  check_rows(a.rows, fn);
  check_dim(a.hidden, fn, "hidden (D)");
  check_dim(a.intermediate, fn, "intermediate (I)");
  bool const no_rows = a.rows.row_capacity == 0;
  check_pointer(a.x, no_rows, fn, "x");
  check_pointer(a.dy, no_rows, fn, "dy");
  check_pointer(a.d_gate_up, no_rows, fn, "d_gate_up");
  check_pointer(a.scaled_activation, no_rows, fn, "scaled_activation");
  check_one_output(a.d_w_gate_up, a.d_w_gate_up_bf16, fn, "d_w_gate_up");
  check_one_output(a.d_w_down, a.d_w_down_bf16, fn, "d_w_down");
  if (a.d_w_gate_up_bf16 != nullptr || a.d_w_down_bf16 != nullptr) {  // bf16 sums stop and go on in partials
    if (a.rows.first_row > 0) {
      CARACAL_CHECK(a.partial_in != nullptr, fn, ": bf16 gradients over a window from rows.first_row = ",
                    a.rows.first_row, " need partial_in (the fp32 sums the window before stopped at), got null");
      check_pointer(a.partial_in, false, fn, "partial_in");
    }
    if (a.rows.end_row > 0 && a.rows.end_row < a.rows.row_capacity) {
      CARACAL_CHECK(a.partial_out != nullptr, fn, ": bf16 gradients over a window to rows.end_row = ",
                    a.rows.end_row, " (before row_capacity = ", a.rows.row_capacity,
                    ") need partial_out (where its fp32 sums stop), got null");
      check_pointer(a.partial_out, false, fn, "partial_out");
    }
    CARACAL_CHECK(a.partial_in == nullptr || a.partial_in != a.partial_out, fn,
                  ": partial_in and partial_out must be different buffers (a window reads one while it writes the "
                  "other), got ",
                  static_cast<const void*>(a.partial_in), " for both");
  }
  check_num_ctas(a.num_ctas, fn);
  check_weight_tile_count(a.rows.num_experts, 2 * int64_t(a.intermediate), a.hidden, fn);
  check_weight_tile_count(a.rows.num_experts, a.hidden, a.intermediate, fn);
}

int persistent_grid_size(int num_ctas, int64_t max_tiles, const char* fn) {
  int ctas = num_ctas;
  if (ctas == 0) {
    int device = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err == cudaSuccess) {
      err = cudaDeviceGetAttribute(&ctas, cudaDevAttrMultiProcessorCount, device);
    }
    CARACAL_CHECK(err == cudaSuccess, fn, ": cannot read the SM count: ", cudaGetErrorString(err));
  }
  return int(std::max<int64_t>(1, std::min<int64_t>(ctas, max_tiles)));
}

cudaLaunchAttribute pair_cluster_attribute() {
  cudaLaunchAttribute cluster{};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = 2;  // kPairCtas (tma_pair_pipeline.cuh)
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  return cluster;
}

int max_active_pairs(const void* kernel, int threads, int smem_bytes, const char* fn) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  CARACAL_CHECK(err == cudaSuccess, fn, ": cannot read the current device: ", cudaGetErrorString(err));
  static std::mutex mutex;
  static std::map<std::pair<const void*, int>, int> known;
  std::lock_guard<std::mutex> lock(mutex);
  auto [it, added] = known.try_emplace({kernel, device}, 0);
  if (added) {
    cudaLaunchAttribute cluster = pair_cluster_attribute();
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(2);
    config.blockDim = dim3(unsigned(threads));
    config.dynamicSmemBytes = size_t(smem_bytes);
    config.attrs = &cluster;
    config.numAttrs = 1;
    int pairs = 0;
    err = cudaOccupancyMaxActiveClusters(&pairs, kernel, &config);
    if (err != cudaSuccess || pairs < 1) known.erase(it);
    CARACAL_CHECK(err == cudaSuccess && pairs >= 1, fn, ": no cluster of two CTAs fits on the GPU (",
                  err == cudaSuccess ? "none would run" : cudaGetErrorString(err), ")");
    it->second = pairs;
  }
  return it->second;
}

}  // namespace caracal::gemm
