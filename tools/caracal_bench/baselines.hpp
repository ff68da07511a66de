#pragma once
// caracal bench's baselines, timed in the same run as the layer:
//   cuBLAS dense bf16 GEMMs of the layer's shapes and FLOPs (the practical roofline);
//   at W = 1, the NCCL host-synchronized exchange (bench/baselines/nccl_baseline_exchange.hpp) plus the
//   layer's own grouped GEMMs on the rows it delivered.
#include <cstdint>
#include <string>

#include "bench_options.hpp"
#include "caracal/layer_config.hpp"
#include "caracal/routing.hpp"

namespace caracal::bench_tool {

struct Baseline {
  bool available = false;
  std::string note;  // why not, or what it is
  double forward_ms = 0.0, backward_ms = 0.0, exchange_ms = 0.0;
  double step_ms() const { return forward_ms + backward_ms; }
};

// cuBLAS dense bf16 GEMMs (fp32 accumulation) of the layer's shapes for `tokens` tokens on GPU
// `device`: routed up/gate [tokens*k x 2I x D] and down [tokens*k x D x I], the shared expert's
// the same with `tokens` rows; backward runs each GEMM twice (its FLOPs are twice the forward's).
Baseline time_cublas(const LayerConfig& c, int64_t tokens, const BenchOptions& a, int device);

// The NCCL host-synchronized exchange at W = 1 (dispatch + combine; the backward moves the same
// rows again, dy out and dx back), plus the layer's own grouped GEMMs (gemm::expert_forward and
// expert_backward: the routed experts on the rows the exchange delivered, the shared expert on the
// tokens), timed separately and summed. The rows are padded to the 128-row tile, and the padded
// offsets computed on the host and uploaded, once, outside the timed region: a framework would
// write the rows at their padded places in its exchange's reorder and upload the offsets with its
// reorder table, which the exchange time already counts (zeroing the padding rows aside).
// Unavailable (with a note saying why) at W > 1 or when NCCL fails.
Baseline time_nccl_baseline(const LayerConfig& c, const Routing& routing, const BenchOptions& a, int device);

}  // namespace caracal::bench_tool
