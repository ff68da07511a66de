// quantize_columns_of_e4m3 (quantize_fp8.hpp): e4m3 rows, taken back to fp32 with their 1 x 128
// scales, quantized down their columns (quantize_columns_kernel.cuh, the only instantiation in this
// unit; tokens' rows read in place are quantize_columns_e4m3_gathered.cu's).
#include "caracal/comm/cuda_check.hpp"
#include "caracal/error.hpp"
#include "quant/operand_checks.hpp"
#include "quant/quantize_columns_kernel.cuh"

namespace caracal::quant {

void quantize_columns_of_e4m3(const QuantizeColumnsArgs& args, const E4m3Rows& rows, cudaStream_t stream) {
  constexpr const char* kWhere = "quant::quantize_columns_of_e4m3";
  CARACAL_CHECK(args.values == nullptr, kWhere, ": args.values must be null (the values are `rows`), got ",
                static_cast<const void*>(args.values));
  CARACAL_CHECK(args.rows >= 0 && args.rows % 4 == 0, kWhere, ": rows must be a non-negative multiple of 4, got ",
                args.rows);
  CARACAL_CHECK(args.cols > 0 && args.cols % kFp8Block == 0, kWhere, ": cols must be a positive multiple of ",
                kFp8Block, " (whole scaling blocks), got ", args.cols);
  if (args.rows == 0) return;
  check_operands(kWhere, {{rows.codes, "rows.codes", 16}, {rows.scales, "rows.scales", 4}, {args.codes_t, "codes_t", 4},
                          {args.scales, "scales", 4}});
  if (rows.routes != nullptr) {  // tokens' rows read in place
    CARACAL_CHECK(rows.top_k >= 1, kWhere, ": rows.top_k must be >= 1 with rows.routes, got ", rows.top_k);
    CARACAL_CHECK(rows.scale_block_stride >= 1, kWhere, ": rows.scale_block_stride must be >= 1, got ",
                  rows.scale_block_stride);
    quantize_columns_of_gathered_e4m3(args, rows, column_blocks(args, kWhere), stream);
    return;
  }
  CARACAL_CHECK(rows.scale_block_stride >= args.rows, kWhere, ": rows.scale_block_stride must be at least rows (",
                args.rows, "), got ", rows.scale_block_stride);
  const int blocks = column_blocks(args, kWhere);
  quantize_columns_kernel<<<blocks, kColumnThreads<E4m3ColumnValues>, 0, stream>>>(
      args, E4m3ColumnValues{rows.codes, rows.scales, rows.scale_block_stride, args.cols});
  check_cuda(cudaGetLastError(), "quantize_columns_kernel (e4m3) launch");
}

}  // namespace caracal::quant
