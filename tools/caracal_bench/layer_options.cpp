#include "layer_options.hpp"

namespace caracal::bench_tool {

LayerSetup layer_setup(const BenchOptions& a, bool fused_forward) {
  LayerSetup s;
  s.options.exchange_sms = a.exchange_sms;
  s.options.fused_forward = fused_forward;
  s.options.fused_comm_ctas = a.fused_comm_ctas;
  s.options.ring_rows = a.ring_rows;
  s.options.bf16_weight_gradients = a.bf16_weight_grads;  // the partial sums only where bf16 ones are asked for
  s.options.fp8_weight_gradients = a.fp8_weight_grads == "fp8";
  s.experiments.pull_all_rows = a.fused_pull_all_rows;
  s.experiments.rows_per_route = a.rows_per_route;
  s.experiments.dx_rows_per_route = a.dx_rows_per_route;
  s.experiments.fused_fp8_forward = a.fused_fp8_forward;
  s.experiments.fused_fp8_backward = a.fused_fp8_backward;
  return s;
}

nlohmann::json setup_json(const LayerSetup& s) {
  const MoELayerOptions& o = s.options;
  const layer::LayerExperiments& e = s.experiments;
  return {{"gemm_ctas", o.gemm_ctas},
          {"exchange_sms", o.exchange_sms},
          {"fused_forward", o.fused_forward},
          {"fused_comm_ctas", o.fused_comm_ctas},
          {"ring_rows", o.ring_rows},
          {"bf16_weight_gradients", o.bf16_weight_gradients},
          {"fp8_weight_gradients", o.fp8_weight_gradients},
          {"experiments",
           {{"pull_all_rows", e.pull_all_rows},
            {"rows_per_route", e.rows_per_route},
            {"dx_rows_per_route", e.dx_rows_per_route},
            {"fused_fp8_forward", e.fused_fp8_forward},
            {"fused_fp8_backward", e.fused_fp8_backward}}}};
}

}  // namespace caracal::bench_tool
