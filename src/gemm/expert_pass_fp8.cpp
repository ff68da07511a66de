#include "caracal/gemm/expert_pass_fp8.hpp"

#include <utility>

#include "caracal/error.hpp"
#include "gemm/pass_args.hpp"
#include "quant/quantize_fp8.hpp"

namespace caracal::gemm {
namespace {

// An FP8 GEMM's arguments with the pass's rows, shape, CTA count and tile queue.
template <typename Args>
Args fp8_gemm_args(const Fp8ExpertPass& pass) {
  Args a = pass_args<Args>(pass);
  a.tile_queue = pass.tile_queue;
  return a;
}

Fp8RowOperand operand(const Fp8RowOutput& rows) { return {rows.codes, rows.scales}; }

// `values` [buffer rows][cols] into `out`, in the layout the FP8 GEMMs read (padding rows, zero,
// become zero codes under the smallest scale).
void quantize_pass_rows(const Fp8ExpertPass& pass, const __nv_bfloat16* values, int cols, const Fp8RowOutput& out,
                        cudaStream_t stream) {
  quant::QuantizeRowsArgs q;
  q.values = values;
  q.rows = pass.rows.buffer_rows();
  q.cols = cols;
  q.codes = out.codes;
  q.scales = out.scales;
  q.scale_row_stride = 1;
  q.scale_block_stride = q.rows;
  quant::quantize_rows(q, stream);
}

// The pass's [buffer rows][cols] quantized down their columns into `out`: codes [cols][buffer rows],
// scales MN-major (the weight-gradient GEMMs' layout), exact scales. The caller sets the source.
quant::QuantizeColumnsArgs pass_column_args(const Fp8ExpertPass& pass, int cols, const Fp8ColumnOutput& out) {
  quant::QuantizeColumnsArgs q;
  q.rows = pass.rows.buffer_rows();
  q.cols = cols;
  q.codes_t = out.codes_t;
  q.codes_row_stride = q.rows;
  q.scales = out.scales;
  q.scale_col_stride = 1;
  q.scale_block_stride = cols;
  return q;
}

// `values` ([buffer rows][cols] bf16) quantized down their columns into `out`.
void quantize_pass_columns(const Fp8ExpertPass& pass, const __nv_bfloat16* values, int cols,
                           const Fp8ColumnOutput& out, cudaStream_t stream) {
  quant::QuantizeColumnsArgs q = pass_column_args(pass, cols, out);
  q.values = values;
  quant::quantize_columns(q, stream);
}

// e4m3 rows `rows` ([buffer rows][cols], x_fp8 or dy_fp8) dequantized and quantized down their
// columns into `out` (pass.x or pass.dy null).
void quantize_pass_columns_of_e4m3(const Fp8ExpertPass& pass, const Fp8RowOutput& rows, int cols,
                                   const Fp8ColumnOutput& out, cudaStream_t stream) {
  const quant::QuantizeColumnsArgs q = pass_column_args(pass, cols, out);
  quant::quantize_columns_of_e4m3(q, {rows.codes, rows.scales, q.rows}, stream);
}

// A pass with FP8 weight gradients: all eight column pointers given, named if not; the whole
// schedule (no ring, window or partial sums).
void check_fp8_weight_grads(const Fp8ExpertPass& pass, const ExpertPassGradients& grads) {
  constexpr const char* kWhere = "expert_backward (fp8)";
  const std::pair<const Fp8ColumnOutput*, const char*> columns[] = {{&pass.x_columns, "pass.x_columns"},
                                                                    {&pass.dy_columns, "pass.dy_columns"},
                                                                    {&pass.d_gate_up_columns, "pass.d_gate_up_columns"},
                                                                    {&pass.activation_columns, "pass.activation_columns"}};
  for (const auto& [c, name] : columns) {
    CARACAL_CHECK(c->codes_t != nullptr && c->scales != nullptr, kWhere, ": FP8 weight gradients need all four column "
                  "outputs or none: ", name, ".codes_t and ", name, ".scales must not be null");
  }
  CARACAL_CHECK(pass.rows.ring_rows == 0 && pass.rows.first_row == 0 && pass.rows.end_row == 0, kWhere,
                ": FP8 weight gradients run over the whole schedule: pass.rows.ring_rows, first_row and end_row "
                "must be 0, got ", pass.rows.ring_rows, ", ", pass.rows.first_row, " and ", pass.rows.end_row);
  CARACAL_CHECK(grads.partial_in == nullptr && grads.partial_out == nullptr, kWhere,
                ": FP8 weight gradients run over the whole schedule: grads.partial_in and grads.partial_out must "
                "be null");
  CARACAL_CHECK(pass.x != nullptr || (pass.x_columns.codes_t != static_cast<void*>(pass.x_fp8.codes) &&
                                      pass.x_columns.scales != pass.x_fp8.scales),
                kWhere, ": with pass.x null x's columns are quantized from pass.x_fp8, so pass.x_columns must not "
                "take its memory");
  CARACAL_CHECK(pass.dy != nullptr || (pass.dy_columns.codes_t != static_cast<void*>(pass.dy_fp8.codes) &&
                                       pass.dy_columns.scales != pass.dy_fp8.scales),
                kWhere, ": with pass.dy null dy's columns are quantized from pass.dy_fp8, so pass.dy_columns must "
                "not take its memory");
}


// x's, dy's and g·activation's columns (from the bf16 rows where the pass gives them, else from the
// e4m3 rows: the tokens' at home, or x_fp8 / dy_fp8).
void quantize_columns_before_dx(const Fp8ExpertPass& pass, cudaStream_t stream) {
  if (pass.x != nullptr) {
    quantize_pass_columns(pass, pass.x, pass.hidden, pass.x_columns, stream);
  } else if (pass.x_tokens.codes != nullptr) {  // the tokens' rows in the schedule's order
    const quant::QuantizeColumnsArgs q = pass_column_args(pass, pass.hidden, pass.x_columns);
    quant::quantize_columns_of_e4m3(q, {pass.x_tokens.codes, pass.x_tokens.scales, pass.x_tokens.scale_block_stride,
                                        pass.rows.rows, pass.top_k},
                                    stream);
  } else {
    quantize_pass_columns_of_e4m3(pass, pass.x_fp8, pass.hidden, pass.x_columns, stream);
  }
  if (pass.dy != nullptr) {
    quantize_pass_columns(pass, pass.dy, pass.hidden, pass.dy_columns, stream);
  } else {
    quantize_pass_columns_of_e4m3(pass, pass.dy_fp8, pass.hidden, pass.dy_columns, stream);
  }
  quantize_pass_columns(pass, pass.activation, pass.intermediate, pass.activation_columns, stream);
}

// d_gate_up's columns (after dx: they may take d_gate_up_fp8's memory), then the weight-gradient GEMMs.
void fp8_weight_grads_after_dx(const Fp8ExpertPass& pass, const ExpertPassGradients& grads, cudaStream_t stream) {
  quantize_pass_columns(pass, pass.d_gate_up, 2 * pass.intermediate, pass.d_gate_up_columns, stream);
  Fp8WeightGradArgs w;
  w.rows = pass.rows;
  w.hidden = pass.hidden;
  w.intermediate = pass.intermediate;
  w.num_ctas = pass.num_ctas;
  const auto columns = [](const Fp8ColumnOutput& c) { return Fp8ColumnOperand{c.codes_t, c.scales}; };
  w.x = columns(pass.x_columns);
  w.dy = columns(pass.dy_columns);
  w.d_gate_up = columns(pass.d_gate_up_columns);
  w.scaled_activation = columns(pass.activation_columns);
  w.d_w_gate_up = grads.w_gate_up;
  w.d_w_down = grads.w_down;
  w.d_w_gate_up_bf16 = grads.w_gate_up_bf16;
  w.d_w_down_bf16 = grads.w_down_bf16;
  grouped_weight_grads(w, stream);
}

}  // namespace

Fp8ExpertWeightSizes fp8_expert_weight_sizes(int experts, int hidden, int intermediate) {
  const auto blocks = [](int extent) { return quant::weight_blocks(extent); };
  const auto row = [&](int extent) { return size_t(quant::weight_scale_row(blocks(extent))); };
  const size_t L = size_t(experts), D = size_t(hidden), I = size_t(intermediate);
  Fp8ExpertWeightSizes s;
  s.w_gate_up_codes = L * 2 * I * D;
  s.w_gate_up_scales = L * size_t(blocks(hidden)) * row(2 * intermediate);
  s.w_gate_up_scales_t = L * size_t(blocks(2 * intermediate)) * row(hidden);
  s.w_down_codes = L * D * I;
  s.w_down_scales = L * size_t(blocks(intermediate)) * row(hidden);
  s.w_down_scales_t = L * size_t(blocks(hidden)) * row(intermediate);
  return s;
}

namespace {

// Carves buffers of `count` T each, 256-byte aligned, in order from `base` (null: only counts).
class WeightBlock {
 public:
  explicit WeightBlock(void* base) : base_(static_cast<char*>(base)) {}
  template <typename T>
  T* take(size_t count) {
    constexpr size_t kAlignment = 256;
    T* const at = base_ ? reinterpret_cast<T*>(base_ + bytes_) : nullptr;
    bytes_ += (count * sizeof(T) + kAlignment - 1) / kAlignment * kAlignment;
    return at;
  }
  size_t bytes() const { return bytes_; }

 private:
  char* base_;
  size_t bytes_ = 0;
};

Fp8ExpertWeightBuffers carve(WeightBlock& block, int experts, int hidden, int intermediate) {
  const Fp8ExpertWeightSizes s = fp8_expert_weight_sizes(experts, hidden, intermediate);
  Fp8ExpertWeightBuffers b;
  b.w_gate_up_codes = block.take<__nv_fp8_e4m3>(s.w_gate_up_codes);
  b.w_gate_up_scales = block.take<float>(s.w_gate_up_scales);
  b.w_gate_up_codes_t = block.take<__nv_fp8_e4m3>(s.w_gate_up_codes);
  b.w_gate_up_scales_t = block.take<float>(s.w_gate_up_scales_t);
  b.w_down_codes = block.take<__nv_fp8_e4m3>(s.w_down_codes);
  b.w_down_scales = block.take<float>(s.w_down_scales);
  b.w_down_codes_t = block.take<__nv_fp8_e4m3>(s.w_down_codes);
  b.w_down_scales_t = block.take<float>(s.w_down_scales_t);
  return b;
}

}  // namespace

size_t fp8_expert_weight_bytes(int experts, int hidden, int intermediate) {
  WeightBlock block(nullptr);
  (void)carve(block, experts, hidden, intermediate);
  return block.bytes();
}

Fp8ExpertWeightBuffers fp8_expert_weight_buffers(void* block, int experts, int hidden, int intermediate) {
  CARACAL_CHECK(block != nullptr && reinterpret_cast<uintptr_t>(block) % 256 == 0,
                "fp8_expert_weight_buffers: block must be a 256-byte aligned device pointer, got ", block);
  WeightBlock weights(block);
  return carve(weights, experts, hidden, intermediate);
}

Fp8ExpertWeights fp8_expert_weight_operands(const void* block, int experts, int hidden, int intermediate) {
  // The GEMMs only read the operands: the carving needs no write access.
  return fp8_expert_weight_buffers(const_cast<void*>(block), experts, hidden, intermediate).operands();
}

Fp8ExpertWeights Fp8ExpertWeightBuffers::operands() const {
  return {{w_gate_up_codes, w_gate_up_scales},
          {w_gate_up_codes_t, w_gate_up_scales_t},
          {w_down_codes, w_down_scales},
          {w_down_codes_t, w_down_scales_t}};
}

void quantize_expert_weights(const ExpertPassWeights& weights, int experts, int hidden, int intermediate,
                             const Fp8ExpertWeightBuffers& out, cudaStream_t stream) {
  CARACAL_CHECK(weights.w_gate_up_layout == GateUpLayout::kInterleaved,
                "quantize_expert_weights: weights.w_gate_up_layout must be interleaved (the FP8 GEMMs' order)");
  // One [experts][n][k] weight into its codes and scales, both orientations.
  const auto quantize = [&](const __nv_bfloat16* w, int64_t n, int64_t k, __nv_fp8_e4m3* codes, float* scales,
                            __nv_fp8_e4m3* codes_t, float* scales_t) {
    quant::QuantizeWeightsArgs a;
    a.weights = w;
    a.experts = experts;
    a.n = n;
    a.k = k;
    a.codes = codes;
    a.scales = scales;
    a.codes_t = codes_t;
    a.scales_t = scales_t;
    quant::quantize_weights(a, stream);
  };
  quantize(weights.w_gate_up, 2 * int64_t(intermediate), hidden, out.w_gate_up_codes, out.w_gate_up_scales,
           out.w_gate_up_codes_t, out.w_gate_up_scales_t);
  quantize(weights.w_down, hidden, intermediate, out.w_down_codes, out.w_down_scales, out.w_down_codes_t,
           out.w_down_scales_t);
}

void expert_forward(const Fp8ExpertPass& pass, const Fp8ExpertWeights& weights, cudaStream_t stream, Fp8XRows x) {
  expert_up_gate(pass, weights, stream, x);
  expert_down(pass, weights, stream);
}

Fp8UpGateSwigluArgs up_gate_gemm_args(const Fp8ExpertPass& pass, const Fp8ExpertWeights& weights) {
  auto up = fp8_gemm_args<Fp8UpGateSwigluArgs>(pass);
  if (pass.x_tokens.codes != nullptr) {
    up.x_tokens = pass.x_tokens;
    up.top_k = pass.top_k;
  } else {
    up.x = operand(pass.x_fp8);
  }
  up.w_gate_up = weights.w_gate_up;
  up.activation_fp8_out = pass.activation_fp8;  // the down GEMM's operand; the backward reads none
  up.gate_up_out = pass.gate_up;                 // backward recomputes SwiGLU from it
  return up;
}

Fp8DownProjArgs down_gemm_args(const Fp8ExpertPass& pass, const Fp8ExpertWeights& weights) {
  auto down = fp8_gemm_args<Fp8DownProjArgs>(pass);
  down.activation = operand(pass.activation_fp8);
  down.w_down = weights.w_down;
  down.y_out = pass.out;
  return down;
}

void expert_up_gate(const Fp8ExpertPass& pass, const Fp8ExpertWeights& weights, cudaStream_t stream, Fp8XRows x) {
  CARACAL_CHECK(pass.x_tokens.codes == nullptr || x == Fp8XRows::kGiven, "expert_up_gate (fp8): pass.x_tokens are "
                "e4m3 rows already: x must be Fp8XRows::kGiven with them");
  if (x == Fp8XRows::kQuantize) quantize_pass_rows(pass, pass.x, pass.hidden, pass.x_fp8, stream);
  grouped_up_gate_swiglu(up_gate_gemm_args(pass, weights), stream);
}

void expert_down(const Fp8ExpertPass& pass, const Fp8ExpertWeights& weights, cudaStream_t stream) {
  grouped_down_proj(down_gemm_args(pass, weights), stream);
}

Fp8DownDgradSwigluArgs dgrad_gemm_args(const Fp8ExpertPass& pass, const Fp8ExpertWeights& weights) {
  auto dgrad = fp8_gemm_args<Fp8DownDgradSwigluArgs>(pass);
  dgrad.dy = operand(pass.dy_fp8);
  dgrad.w_down_t = weights.w_down_t;
  dgrad.gate_up = pass.gate_up;
  dgrad.gates = pass.gates;
  dgrad.d_gate_up_out = pass.d_gate_up;
  dgrad.d_gate_up_fp8_out = pass.d_gate_up_fp8;
  dgrad.scaled_activation_out = pass.activation;
  dgrad.d_gates_out = pass.dg;
  dgrad.workspace = pass.workspace;
  return dgrad;
}

Fp8GateUpDgradArgs dx_gemm_args(const Fp8ExpertPass& pass, const Fp8ExpertWeights& weights) {
  auto dx = fp8_gemm_args<Fp8GateUpDgradArgs>(pass);
  dx.d_gate_up = operand(pass.d_gate_up_fp8);
  dx.w_gate_up_t = weights.w_gate_up_t;
  dx.dx_out = pass.dx;
  return dx;
}

void expert_backward(const Fp8ExpertPass& pass, const Fp8ExpertWeights& weights, const ExpertPassGradients& grads,
                     cudaStream_t stream) {
  CARACAL_CHECK(grads.w_gate_up_layout == GateUpLayout::kInterleaved,
                "expert_backward (fp8): grads.w_gate_up_layout must be interleaved (the FP8 GEMMs' order)");
  if (pass.fp8_weight_grads()) check_fp8_weight_grads(pass, grads);  // before anything is overwritten
  CARACAL_CHECK((pass.x != nullptr && pass.dy != nullptr) || pass.fp8_weight_grads(), "expert_backward (fp8): "
                "pass.x and pass.dy may be null only with FP8 weight gradients (the bf16 weight-gradient GEMMs "
                "read their bf16 rows)");
  if (pass.dy != nullptr) quantize_pass_rows(pass, pass.dy, pass.hidden, pass.dy_fp8, stream);  // else given
  grouped_down_dgrad_swiglu(dgrad_gemm_args(pass, weights), stream);

  const Fp8GateUpDgradArgs dx = dx_gemm_args(pass, weights);
  if (!pass.fp8_weight_grads()) {
    // The weight gradients on the bf16 rows, before dx may overwrite x.
    ExpertPass bf16_rows;
    bf16_rows.rows = pass.rows;
    bf16_rows.hidden = pass.hidden;
    bf16_rows.intermediate = pass.intermediate;
    bf16_rows.num_ctas = pass.num_ctas;
    bf16_rows.tile_queue = pass.tile_queue;
    bf16_rows.x = pass.x;
    bf16_rows.dy = pass.dy;
    bf16_rows.d_gate_up = pass.d_gate_up;
    bf16_rows.activation = pass.activation;
    expert_weight_grads(bf16_rows, grads, stream);
    grouped_gate_up_dgrad(dx, stream);
    return;
  }
  // x, dy and g·activation down their columns before dx may overwrite x; d_gate_up's after dx, which
  // reads the e4m3 rows its columns may take the place of.
  quantize_columns_before_dx(pass, stream);
  grouped_gate_up_dgrad(dx, stream);
  fp8_weight_grads_after_dx(pass, grads, stream);
}

void quantize_dy_rows(const Fp8ExpertPass& pass, cudaStream_t stream) {
  CARACAL_CHECK(pass.dy != nullptr, "quantize_dy_rows (fp8): pass.dy must not be null");
  quantize_pass_rows(pass, pass.dy, pass.hidden, pass.dy_fp8, stream);
}

void expert_weight_grads(const Fp8ExpertPass& pass, const ExpertPassGradients& grads, cudaStream_t stream) {
  CARACAL_CHECK(pass.fp8_weight_grads(), "expert_weight_grads (fp8): the pass must give its column outputs "
                "(x_columns, dy_columns, d_gate_up_columns, activation_columns)");
  CARACAL_CHECK(grads.w_gate_up_layout == GateUpLayout::kInterleaved,
                "expert_weight_grads (fp8): grads.w_gate_up_layout must be interleaved (the FP8 GEMMs' order)");
  check_fp8_weight_grads(pass, grads);
  quantize_columns_before_dx(pass, stream);
  fp8_weight_grads_after_dx(pass, grads, stream);
}

}  // namespace caracal::gemm
