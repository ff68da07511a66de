#include "layer_options.hpp"

namespace caracal::bench_tool {

MoELayerOptions layer_options(const BenchOptions& a, bool fused_forward) {
  MoELayerOptions options;
  options.exchange_sms = a.exchange_sms;
  options.fused_forward = fused_forward;
  options.fused_comm_ctas = a.fused_comm_ctas;
  options.fused_pull_all_rows = a.fused_pull_all_rows;
  options.fused_backward = !a.separate_backward;
  options.dx_sums_in_weight_grads = !a.separate_dx_sums;
  options.fused_backward_local_rows_in_launch = !a.local_rows_before_backward;
  options.rows_per_route = a.rows_per_route;
  options.dx_rows_per_route = a.dx_rows_per_route;
  options.ring_rows = a.ring_rows;
  options.bf16_weight_gradients = a.bf16_weight_grads;  // the partial sums only where bf16 ones are asked for
  return options;
}

nlohmann::json options_json(const MoELayerOptions& o) {
  return {{"gemm_ctas", o.gemm_ctas},
          {"exchange_sms", o.exchange_sms},
          {"fused_forward", o.fused_forward},
          {"fused_comm_ctas", o.fused_comm_ctas},
          {"fused_backward", o.fused_backward},
          {"dx_sums_in_weight_grads", o.dx_sums_in_weight_grads},
          {"fused_backward_local_rows_in_launch", o.fused_backward_local_rows_in_launch},
          {"dx_rows_per_route", o.dx_rows_per_route},
          {"fused_pull_all_rows", o.fused_pull_all_rows},
          {"rows_per_route", o.rows_per_route},
          {"ring_rows", o.ring_rows},
          {"bf16_weight_gradients", o.bf16_weight_gradients}};
}

}  // namespace caracal::bench_tool
