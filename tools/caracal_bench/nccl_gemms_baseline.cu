#include <cuda_bf16.h>

#include <cstddef>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "baselines.hpp"
#include "caracal/comm/cuda_check.hpp"
#include "caracal/comm/nccl_bootstrap.hpp"
#include "caracal/gemm/expert_pass.hpp"
#include "cuda_stream.hpp"
#include "device_buffer.hpp"
#include "device_random.cuh"
#include "event_timer.hpp"
#include "expert_weights.hpp"
#include "nccl_baseline_exchange.hpp"
#include "padded_expert_pass.hpp"

namespace caracal::bench_tool {

namespace {

// One rank's tokens: x and dy (random), y, the gates (random) and the routing's expert ids.
struct TokenInputs {
  comm::DeviceMemory<__nv_bfloat16> x, dy, y;
  comm::DeviceMemory<float> gates;
  comm::DeviceMemory<int32_t> idx;

  TokenInputs(const LayerConfig& c, const Routing& routing, uint64_t seed, cudaStream_t stream) {
    const size_t T = size_t(c.tokens_per_rank), k = size_t(c.shape.top_k), D = size_t(c.shape.hidden);
    x = device_buffer<__nv_bfloat16>(T * D, "cudaMalloc(baseline x)");
    dy = device_buffer<__nv_bfloat16>(T * D, "cudaMalloc(baseline dy)");
    y = device_buffer<__nv_bfloat16>(T * D, "cudaMalloc(baseline y)");
    gates = device_buffer<float>(T * k, "cudaMalloc(baseline gates)");
    idx = device_buffer<int32_t>(T * k, "cudaMalloc(baseline topk_idx)");
    bench::fill_uniform(x.get(), T * D, seed + 21, -1.0f, 1.0f, stream);
    bench::fill_uniform(dy.get(), T * D, seed + 23, -1.0f, 1.0f, stream);
    bench::fill_uniform(gates.get(), T * k, seed + 22, 0.05f, 1.0f, stream);
    check_cuda(cudaMemcpyAsync(idx.get(), routing.rank_topk(0), T * k * sizeof(int32_t), cudaMemcpyHostToDevice,
                               stream),
               "cudaMemcpyAsync(baseline topk_idx)");
  }
};

// The routed experts' rows: x and dy as the exchange delivers them (the host learns the counts in
// dispatch), padded.
PaddedExpertPass routed_rows(bench::NcclBaselineExchange& exchange, const TokenInputs& in, const LayerConfig& c,
                             uint64_t seed, cudaStream_t stream) {
  exchange.dispatch(in.idx.get(), in.x.get(), stream);
  PaddedExpertPass routed(exchange.expert_rows(), int(c.shape.hidden), int(c.shape.intermediate), seed + 24, stream);
  routed.load_x(exchange.expert_x(), stream);
  exchange.dispatch(in.idx.get(), in.dy.get(), stream);
  routed.load_dy(exchange.expert_x(), stream);
  return routed;
}

// The shared expert's rows, when there is one: the tokens themselves.
std::optional<PaddedExpertPass> shared_rows(const TokenInputs& in, const LayerConfig& c, uint64_t seed,
                                            cudaStream_t stream) {
  if (c.shape.num_shared_experts <= 0) return std::nullopt;
  std::optional<PaddedExpertPass> shared;
  shared.emplace(std::vector<int64_t>{c.tokens_per_rank}, int(c.shape.hidden), int(c.shape.shared_intermediate),
                 seed + 25, stream);
  shared->load_x(in.x.get(), stream);
  shared->load_dy(in.dy.get(), stream);
  return shared;
}

struct NcclGemmsTimes {
  double exchange_ms = 0.0, forward_gemms_ms = 0.0, backward_gemms_ms = 0.0;
};

// Throws what NCCL, CUDA or the exchange throw.
NcclGemmsTimes measure(const LayerConfig& c, const Routing& routing, const BenchOptions& a, int device) {
  std::vector<comm::NcclComm> comms = comm::init_all({device});
  transfer::ExchangeShape shape;
  shape.tokens = c.tokens_per_rank;
  shape.top_k = c.shape.top_k;
  shape.hidden = c.shape.hidden;
  shape.num_experts = c.shape.num_experts;
  const bench::Stream stream;
  bench::NcclBaselineExchange exchange(comms[0].get(), shape);
  const TokenInputs in(c, routing, a.seed, stream.get());
  const bool bf16_grads = a.bf16_weight_grads;  // as the layer's
  const ExpertWeights weights =
      make_expert_weights(c, a.seed + 30, bf16_grads ? GradientBuffers::bf16 : GradientBuffers::fp32, stream.get());
  const MoEWeights w = weights.weights();
  const PaddedExpertPass routed = routed_rows(exchange, in, c, a.seed, stream.get());
  const std::optional<PaddedExpertPass> shared = shared_rows(in, c, a.seed, stream.get());
  check_cuda(cudaStreamSynchronize(stream.get()), "cudaStreamSynchronize(baseline inputs)");

  NcclGemmsTimes t;
  t.exchange_ms = bench::median_ms(stream.get(), a.warmup, a.reps, [&] {
    exchange.dispatch(in.idx.get(), in.x.get(), stream.get());
    exchange.combine(exchange.expert_x(), in.gates.get(), in.y.get(), stream.get());
  });
  // The layer's order: the shared expert's forward first, its backward after the routed one's.
  t.forward_gemms_ms = bench::median_ms(stream.get(), a.warmup, a.reps, [&] {
    if (shared) gemm::expert_forward(shared->pass(), {w.shared_w_gate_up, w.shared_w_down}, stream.get());
    gemm::expert_forward(routed.pass(), {w.w_gate_up, w.w_down}, stream.get());
  });
  t.backward_gemms_ms = bench::median_ms(stream.get(), a.warmup, a.reps, [&] {
    gemm::expert_backward(routed.pass(), {w.w_gate_up, w.w_down}, weights.gradients.routed(bf16_grads), stream.get());
    if (shared) {
      gemm::expert_backward(shared->pass(), {w.shared_w_gate_up, w.shared_w_down}, weights.gradients.shared(bf16_grads),
                            stream.get());
    }
  });
  check_cuda(cudaStreamSynchronize(stream.get()), "cudaStreamSynchronize(baseline)");
  return t;
}

}  // namespace

Baseline time_nccl_baseline(const LayerConfig& c, const Routing& routing, const BenchOptions& a, int device) {
  Baseline out;
  if (c.ep_size != 1) {
    out.note = "measured at W = 1 only";
    return out;
  }
  NcclGemmsTimes t;
  try {
    t = measure(c, routing, a, device);
  } catch (const std::exception& e) {
    out.note = std::string("unavailable: ") + e.what();
    return out;
  }
  out.available = true;
  out.note =
      "NCCL host-synchronized exchange (dispatch+combine per pass) + Caracal's grouped GEMMs (the layer's "
      "expert_forward/expert_backward, shared expert included) on the delivered rows padded to 128 per expert, "
      "timed separately and summed; the padding and the padded offsets (host-computed, uploaded) are prepared "
      "once outside the timed region";
  out.exchange_ms = t.exchange_ms;
  out.forward_ms = t.exchange_ms + t.forward_gemms_ms;
  out.backward_ms = t.exchange_ms + t.backward_gemms_ms;
  return out;
}

}  // namespace caracal::bench_tool
