// quantize_columns_of_e4m3 of tokens' rows read in place (E4m3Rows::routes): the column quantizer
// over GatheredE4m3ColumnValues (quantize_columns_kernel.cuh, the only instantiation in this unit).
#include "caracal/comm/cuda_check.hpp"
#include "quant/quantize_columns_kernel.cuh"

namespace caracal::quant {

void quantize_columns_of_gathered_e4m3(const QuantizeColumnsArgs& args, const E4m3Rows& rows, int blocks,
                                       cudaStream_t stream) {
  quantize_columns_kernel<<<blocks, kColumnThreads<GatheredE4m3ColumnValues>, 0, stream>>>(
      args, GatheredE4m3ColumnValues{rows.codes, rows.scales, rows.scale_block_stride, args.cols, rows.routes,
                                     rows.top_k});
  check_cuda(cudaGetLastError(), "quantize_columns_kernel (gathered e4m3) launch");
}

}  // namespace caracal::quant
