// quantize_columns (quantize_fp8.hpp): bf16 values quantized down their columns
// (quantize_columns_kernel.cuh, the only instantiation in this unit), and the checks both column
// quantizers share.
#include <climits>

#include "caracal/comm/cuda_check.hpp"
#include "caracal/error.hpp"
#include "quant/operand_checks.hpp"
#include "quant/quantize_columns_kernel.cuh"

namespace caracal::quant {

int column_blocks(const QuantizeColumnsArgs& args, const char* where) {
  CARACAL_CHECK(args.codes_row_stride >= args.rows && args.codes_row_stride % 4 == 0, where,
                ": codes_row_stride must be a multiple of 4 and at least rows (", args.rows, "), got ",
                args.codes_row_stride);
  CARACAL_CHECK(args.scale_col_stride > 0 && args.scale_block_stride > 0, where,
                ": scale_col_stride and scale_block_stride must be positive, got ", args.scale_col_stride, " and ",
                args.scale_block_stride);
  const int64_t side = kColumnBlockSide;
  const int64_t blocks = ((args.rows + side - 1) / side) * ((args.cols + side - 1) / side);
  CARACAL_CHECK(blocks <= INT_MAX, where, ": blocks(rows) * blocks(cols) must be below 2^31, got ", blocks);
  return static_cast<int>(blocks);
}

namespace {

// rows and cols as the kernel needs them (quantize_columns_kernel.cuh): whole units of columns (8 bf16
// values), rows by 4.
void check_shape(const QuantizeColumnsArgs& args, const char* where) {
  CARACAL_CHECK(args.rows >= 0 && args.rows % 4 == 0, where, ": rows must be a non-negative multiple of 4, got ",
                args.rows);
  CARACAL_CHECK(args.cols > 0 && args.cols % 8 == 0, where, ": cols must be a positive multiple of 8, got ",
                args.cols);
}

}  // namespace

void quantize_columns(const QuantizeColumnsArgs& args, cudaStream_t stream) {
  constexpr const char* kWhere = "quant::quantize_columns";
  check_shape(args, kWhere);
  if (args.rows == 0) return;
  check_operands(kWhere, {{args.values, "values", 16}, {args.codes_t, "codes_t", 4}, {args.scales, "scales", 4}});
  const int blocks = column_blocks(args, kWhere);
  quantize_columns_kernel<<<blocks, kColumnThreads<Bf16ColumnValues>, 0, stream>>>(args, Bf16ColumnValues{args.values, args.cols});
  check_cuda(cudaGetLastError(), "quantize_columns_kernel launch");
}

}  // namespace caracal::quant
