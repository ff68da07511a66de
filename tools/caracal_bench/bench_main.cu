// caracal-bench: `caracal bench` (issue 5). The `caracal` tool stays host-only (it must plan on a
// machine without a GPU, CUDA driver or NCCL) and execs this binary, which sits next to it, for
// `caracal bench ...`.
//
// 1. Validates MoELayer against the fp64 reference at a small size of the same shape family
//    (bench_validate.hpp) and refuses to time if it fails.
// 2. For each tokens-per-rank value: times forward, backward and forward+backward of the layer
//    (random weights and inputs, warm-up, the median of CUDA-event-bracketed runs), and the
//    baselines in the same run:
//      (a) at W = 1: the NCCL host-synchronized exchange (bench/nccl_baseline_exchange.hpp,
//          dispatch + combine, once per forward and once per backward) + the same grouped GEMMs as
//          the layer (its expert_forward / expert_backward) on the rows the exchange delivered,
//          padded per expert once outside the timed region; timed separately and summed;
//      (b) cuBLAS dense bf16 GEMMs of the layer's shapes and FLOPs (backward: each GEMM twice),
//          the practical roofline.
// FLOPs (DESIGN §1): forward 6*T*k*D*I + 6*T*D*Is per rank, backward twice that; a GPU running a
// loopback world does the work of all W ranks (W*T tokens).
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "bench_validate.hpp"
#include "gpu_threads.hpp"
#include "shape_options.hpp"
#include "caracal/comm/cuda_check.hpp"
#include "caracal/comm/cuda_memory.hpp"
#include "caracal/comm/loopback_world.hpp"
#include "caracal/comm/nccl_bootstrap.hpp"
#include "caracal/comm/nccl_world.hpp"
#include "caracal/error.hpp"
#include "caracal/layer_config.hpp"
#include "caracal/moe_layer.hpp"
#include "caracal/presets.hpp"
#include "caracal/routing.hpp"
#include "device_random.cuh"
#include "event_timer.hpp"
#include "expert_weights.hpp"
#include "caracal/gemm/expert_pass.hpp"
#include "nccl_baseline_exchange.hpp"
#include "padded_expert_pass.hpp"

namespace caracal::bench_tool {

namespace {

struct Args {
  caracal::cli::ShapeOptions shape;
  int64_t ep = 1;
  std::string backend = "loopback";
  int64_t tokens = 4096;
  std::vector<int64_t> sweep;
  std::string routing = "uniform";
  uint64_t seed = 1;
  std::string precision = "bf16";
  int warmup = 5;
  int reps = 20;
  std::string json;
  bool no_validate = false;
  bool quiet = false;
  int exchange_sms = 0;  // MoELayerOptions::exchange_sms
};

struct Pass {
  double ms = 0.0;
  double flops = 0.0;
  double tokens = 0.0;  // per GPU
  double tflops() const { return ms > 0.0 ? flops / (ms * 1e9) : 0.0; }
  double tokens_per_s() const { return ms > 0.0 ? tokens / (ms * 1e-3) : 0.0; }
};

struct Baseline {
  bool available = false;
  std::string note;  // why not, or what it is
  double forward_ms = 0.0, backward_ms = 0.0, exchange_ms = 0.0;
  double step_ms() const { return forward_ms + backward_ms; }
};

struct RunResult {
  int64_t tokens_per_rank = 0;
  int64_t tokens_per_gpu = 0;
  Pass forward, backward, step;
  Baseline cublas, nccl;
};

void progress(const Args& a, const std::string& line) {
  if (!a.quiet) std::cerr << "caracal bench: " << line << std::endl;
}

double gib(double bytes) { return bytes / double(1ull << 30); }

// ---- Device buffers ----------------------------------------------------------------------------

template <typename T>
comm::DeviceMemory<T> alloc(size_t count, const char* what) {
  return comm::device_alloc<T>(std::max<size_t>(count, 1), what);
}

// Bytes of one local rank's weights + fp32 gradients + the layer's memory.
double rank_bytes(const LayerConfig& c) {
  const MoELayerMemory m = MoELayer::memory(c);
  const double L = double(c.local_experts()), D = double(c.shape.hidden), I = double(c.shape.intermediate),
               Is = double(c.shape.shared_intermediate) * double(c.shape.num_shared_experts);
  const double weights = 3.0 * (L * I + Is) * D;
  return double(m.heap) + double(m.local) + weights * (2.0 + 4.0);
}

void check_memory(const LayerConfig& c, int local_ranks, int device) {
  size_t free_bytes = 0, total_bytes = 0;
  check_cuda(cudaSetDevice(device), "cudaSetDevice");
  check_cuda(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  const double need = rank_bytes(c) * local_ranks;
  CARACAL_CHECK(need < 0.94 * double(free_bytes), "T=", c.tokens_per_rank, ", EP=", c.ep_size, " needs about ",
                gib(need), " GiB on GPU ", device, " (weights, fp32 gradients, v1 worst-case buffers) but ",
                gib(double(free_bytes)), " GiB are free: lower --tokens or --experts");
}

// ---- The layer ----------------------------------------------------------------------------------

struct LayerTimes {
  double forward = 0.0, backward = 0.0, step = 0.0;
};

// Warm-up runs of a rank timed in lock-step with ranks in other threads (NCCL, W > 1): enough for
// the layer's sizes (milliseconds a run) to reach the 200 ms the single-GPU timer asks for.
constexpr int kLockstepWarmupRuns = 20;

// Times the layer over `world` (this thread drives its local ranks). Collective for NCCL worlds.
LayerTimes time_layer(comm::World& world, const LayerConfig& c, const Routing& routing, const Args& a) {
  const size_t T = size_t(c.tokens_per_rank), k = size_t(c.shape.top_k), D = size_t(c.shape.hidden);
  MoELayerOptions options;
  options.exchange_sms = a.exchange_sms;
  MoELayer layer(c, world, options);
  cudaStream_t stream = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  std::unique_ptr<CUstream_st, void (*)(cudaStream_t)> stream_guard(stream, [](cudaStream_t s) {
    (void)cudaStreamDestroy(s);
  });

  std::vector<ExpertWeights> memory;
  std::vector<MoEForwardArgs> fwd;
  std::vector<MoEBackwardArgs> bwd;
  for (int l = 0; l < world.local_ranks(); ++l) {
    const uint64_t seed = a.seed * 1000003ull + uint64_t(world.first_local_rank() + l) * 64;
    memory.push_back(make_expert_weights(c, seed, stream));
    const ExpertWeights& m = memory.back();
    // Inputs straight into the layer's own buffers (the zero-copy path).
    const MoELayerBuffers b = layer.buffers(l);
    bench::fill_uniform(b.x, T * D, seed + 5, -1.0f, 1.0f, stream);
    bench::fill_uniform(b.dy, T * D, seed + 6, -1.0f, 1.0f, stream);
    bench::fill_uniform(b.topk_scores, T * k, seed + 7, 0.05f, 1.0f, stream);
    check_cuda(cudaMemcpyAsync(b.topk_idx, routing.rank_topk(world.first_local_rank() + l), T * k * sizeof(int32_t),
                               cudaMemcpyHostToDevice, stream),
               "cudaMemcpyAsync(topk_idx)");
    MoEForwardArgs f;
    f.x = b.x;
    f.topk_idx = b.topk_idx;
    f.topk_scores = b.topk_scores;
    f.weights = m.weights();
    f.y = b.y;
    fwd.push_back(f);
    MoEBackwardArgs g;
    g.dy = b.dy;
    g.dx = b.dx;
    g.d_topk_scores = b.d_topk_scores;
    g.d_w_gate_up = m.d_w_gate_up.get();
    g.d_w_down = m.d_w_down.get();
    g.d_shared_w_gate_up = m.d_shared_w_gate_up.get();  // null without a shared expert
    g.d_shared_w_down = m.d_shared_w_down.get();
    bwd.push_back(g);
  }
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize(bench inputs)");

  // Every rank must make the same launches (they meet in world barriers), but time_runs's warm-up
  // stops when this rank's own clock passes 200 ms. With ranks in other threads, the warm-up is a
  // fixed count instead: the same on all of them.
  const bool lockstep = world.local_ranks() < world.world_size();
  const int warmup = lockstep ? std::max(a.warmup, kLockstepWarmupRuns) : a.warmup;
  const double warmup_ms = lockstep ? 0.0 : 200.0;
  const auto median = [&](const std::function<void()>& run) {
    return bench::time_runs(stream, warmup, a.reps, [&](int) { run(); }, warmup_ms).median_ms;
  };
  LayerTimes t;
  MoEContext context;
  const bool talk = world.first_local_rank() == 0;
  const std::string where = "T=" + std::to_string(c.tokens_per_rank) + ": ";
  if (talk) progress(a, where + "forward");
  t.forward = median([&] { context = layer.forward(fwd, stream); });
  layer.check();
  if (talk) progress(a, where + "backward");
  t.backward = median([&] { layer.backward(bwd, context, stream); });
  layer.check();
  if (talk) progress(a, where + "forward+backward");
  t.step = median([&] {
    context = layer.forward(fwd, stream);
    layer.backward(bwd, context, stream);
  });
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize(bench)");
  layer.check();
  return t;
}

// ---- Baselines ----------------------------------------------------------------------------------

#define BENCH_CUBLAS(expr)                                                                      \
  do {                                                                                          \
    const cublasStatus_t bench_status_ = (expr);                                                \
    CARACAL_CHECK(bench_status_ == CUBLAS_STATUS_SUCCESS, #expr " failed: cuBLAS status ",      \
                  static_cast<int>(bench_status_));                                             \
  } while (0)

// cuBLAS dense bf16 GEMMs (fp32 accumulation) of the layer's shapes for `tokens` tokens on one GPU:
// routed up/gate [tokens*k x 2I x D] and down [tokens*k x D x I], the shared expert's the same with
// `tokens` rows; backward runs each GEMM twice (its FLOPs are twice the forward's).
Baseline time_cublas(const LayerConfig& c, int64_t tokens, const Args& a, int device) {
  check_cuda(cudaSetDevice(device), "cudaSetDevice");
  const int64_t R = tokens * c.shape.top_k, D = c.shape.hidden, I = c.shape.intermediate,
                Is = c.shape.num_shared_experts > 0 ? c.shape.shared_intermediate : 0;
  struct Gemm {
    int64_t m, n, k;
  };
  std::vector<Gemm> gemms = {{R, 2 * I, D}, {R, D, I}};
  if (Is > 0) {
    gemms.push_back({tokens, 2 * Is, D});
    gemms.push_back({tokens, D, Is});
  }
  size_t a_count = 0, b_count = 0, c_count = 0;
  for (const Gemm& g : gemms) {
    CARACAL_CHECK(g.m < (int64_t(1) << 31) && g.n < (int64_t(1) << 31), "cuBLAS baseline: GEMM too large");
    a_count = std::max(a_count, size_t(g.m * g.k));
    b_count = std::max(b_count, size_t(g.n * g.k));
    c_count = std::max(c_count, size_t(g.m * g.n));
  }
  cudaStream_t stream = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  std::unique_ptr<CUstream_st, void (*)(cudaStream_t)> stream_guard(stream, [](cudaStream_t s) {
    (void)cudaStreamDestroy(s);
  });
  auto A = alloc<__nv_bfloat16>(a_count, "cudaMalloc(cuBLAS A)");
  auto B = alloc<__nv_bfloat16>(b_count, "cudaMalloc(cuBLAS B)");
  auto C = alloc<__nv_bfloat16>(c_count, "cudaMalloc(cuBLAS C)");
  bench::fill_uniform(A.get(), a_count, a.seed + 11, -1.0f, 1.0f, stream);
  bench::fill_uniform(B.get(), b_count, a.seed + 12, -0.05f, 0.05f, stream);
  cublasHandle_t handle = nullptr;
  BENCH_CUBLAS(cublasCreate(&handle));
  std::unique_ptr<cublasContext, void (*)(cublasHandle_t)> handle_guard(handle, [](cublasHandle_t h) {
    (void)cublasDestroy(h);
  });
  BENCH_CUBLAS(cublasSetStream(handle, stream));
  const float alpha = 1.0f, beta = 0.0f;
  // Row-major C[m][n] = A[m][k] * B[n][k]^T, i.e. column-major C^T = B^T(op T) * A^T.
  const auto run = [&](const Gemm& g) {
    BENCH_CUBLAS(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, int(g.n), int(g.m), int(g.k), &alpha, B.get(),
                              CUDA_R_16BF, int(g.k), A.get(), CUDA_R_16BF, int(g.k), &beta, C.get(), CUDA_R_16BF,
                              int(g.n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  };
  Baseline out;
  out.available = true;
  out.note = "cuBLAS dense bf16 GEMMs of equal FLOPs";
  out.forward_ms = bench::median_ms(stream, a.warmup, a.reps, [&] {
    for (const Gemm& g : gemms) run(g);
  });
  out.backward_ms = bench::median_ms(stream, a.warmup, a.reps, [&] {
    for (const Gemm& g : gemms) {
      run(g);
      run(g);
    }
  });
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize(cuBLAS)");
  return out;
}

// The NCCL host-synchronized exchange at W = 1 (dispatch + combine; the backward moves the same
// rows again, dy out and dx back), plus the layer's own grouped GEMMs (gemm::expert_forward and
// expert_backward: the routed experts on the rows the exchange delivered, the shared expert on the
// tokens), timed separately and summed. The rows are padded to the 128-row tile, and the padded
// offsets computed on the host and uploaded, once, outside the timed region: a framework would
// write the rows at their padded places in its exchange's reorder and upload the offsets with its
// reorder table, which the exchange time already counts (zeroing the padding rows aside).
Baseline time_nccl_baseline(const LayerConfig& c, const Routing& routing, const Args& a, int device) {
  Baseline out;
  if (c.ep_size != 1) {
    out.note = "measured at W = 1 only";
    return out;
  }
  double forward_gemms_ms = 0.0, backward_gemms_ms = 0.0;
  try {
    std::vector<comm::NcclComm> comms = comm::init_all({device});
    transfer::ExchangeShape shape;
    shape.tokens = c.tokens_per_rank;
    shape.top_k = c.shape.top_k;
    shape.hidden = c.shape.hidden;
    shape.num_experts = c.shape.num_experts;
    const size_t T = size_t(c.tokens_per_rank), k = size_t(c.shape.top_k), D = size_t(c.shape.hidden);
    const int hidden = int(c.shape.hidden), intermediate = int(c.shape.intermediate);
    cudaStream_t stream = nullptr;
    check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    std::unique_ptr<CUstream_st, void (*)(cudaStream_t)> stream_guard(stream, [](cudaStream_t s) {
      (void)cudaStreamDestroy(s);
    });
    bench::NcclBaselineExchange exchange(comms[0].get(), shape);
    auto x = alloc<__nv_bfloat16>(T * D, "cudaMalloc(baseline x)");
    auto dy = alloc<__nv_bfloat16>(T * D, "cudaMalloc(baseline dy)");
    auto y = alloc<__nv_bfloat16>(T * D, "cudaMalloc(baseline y)");
    auto gates = alloc<float>(T * k, "cudaMalloc(baseline gates)");
    auto idx = alloc<int32_t>(T * k, "cudaMalloc(baseline topk_idx)");
    bench::fill_uniform(x.get(), T * D, a.seed + 21, -1.0f, 1.0f, stream);
    bench::fill_uniform(dy.get(), T * D, a.seed + 23, -1.0f, 1.0f, stream);
    bench::fill_uniform(gates.get(), T * k, a.seed + 22, 0.05f, 1.0f, stream);
    check_cuda(cudaMemcpyAsync(idx.get(), routing.rank_topk(0), T * k * sizeof(int32_t), cudaMemcpyHostToDevice,
                               stream),
               "cudaMemcpyAsync(baseline topk_idx)");
    const ExpertWeights weights = make_expert_weights(c, a.seed + 30, stream);
    const MoEWeights w = weights.weights();

    // The GEMMs' rows: x and dy as the exchange delivers them (the host learns the counts in
    // dispatch), padded; the shared expert's are the tokens themselves.
    exchange.dispatch(idx.get(), x.get(), stream);
    PaddedExpertPass routed(exchange.expert_rows(), hidden, intermediate, a.seed + 24, stream);
    routed.load_x(exchange.expert_x(), stream);
    exchange.dispatch(idx.get(), dy.get(), stream);
    routed.load_dy(exchange.expert_x(), stream);
    std::optional<PaddedExpertPass> shared;
    if (c.shape.num_shared_experts > 0) {
      shared.emplace(std::vector<int64_t>{c.tokens_per_rank}, hidden, int(c.shape.shared_intermediate),
                     a.seed + 25, stream);
      shared->load_x(x.get(), stream);
      shared->load_dy(dy.get(), stream);
    }
    check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize(baseline inputs)");

    out.exchange_ms = bench::median_ms(stream, a.warmup, a.reps, [&] {
      exchange.dispatch(idx.get(), x.get(), stream);
      exchange.combine(exchange.expert_x(), gates.get(), y.get(), stream);
    });
    // The layer's order: the shared expert's forward first, its backward after the routed one's.
    forward_gemms_ms = bench::median_ms(stream, a.warmup, a.reps, [&] {
      if (shared) gemm::expert_forward(shared->pass(), {w.shared_w_gate_up, w.shared_w_down}, stream);
      gemm::expert_forward(routed.pass(), {w.w_gate_up, w.w_down}, stream);
    });
    backward_gemms_ms = bench::median_ms(stream, a.warmup, a.reps, [&] {
      gemm::expert_backward(routed.pass(), {w.w_gate_up, w.w_down},
                             {weights.d_w_gate_up.get(), weights.d_w_down.get()}, stream);
      if (shared) {
        gemm::expert_backward(shared->pass(), {w.shared_w_gate_up, w.shared_w_down},
                               {weights.d_shared_w_gate_up.get(), weights.d_shared_w_down.get()}, stream);
      }
    });
    check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize(baseline)");
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
  out.forward_ms = out.exchange_ms + forward_gemms_ms;
  out.backward_ms = out.exchange_ms + backward_gemms_ms;
  return out;
}

// ---- One tokens-per-rank value ------------------------------------------------------------------

RunResult run_one(const LayerConfig& c, const RoutingSpec& spec, const Args& a, int devices) {
  const int W = int(c.ep_size);
  const bool nccl = a.backend == "nccl";
  RunResult r;
  r.tokens_per_rank = c.tokens_per_rank;
  r.tokens_per_gpu = nccl ? c.tokens_per_rank : c.tokens_per_rank * W;
  const Routing routing = make_routing(spec, W, c.tokens_per_rank, c.shape.top_k, c.shape.num_experts);
  for (int d = 0; d < (nccl ? W : 1); ++d) check_memory(c, nccl ? 1 : W, d);
  (void)devices;

  LayerTimes t;
  const size_t heap = MoELayer::heap_bytes(c);
  if (!nccl) {
    comm::LoopbackWorld world(W, heap, 0);
    t = time_layer(world, c, routing, a);
  } else if (W == 1) {
    std::vector<comm::NcclComm> comms = comm::init_all({0});
    comm::NcclWorld world(comms[0].get(), heap);
    t = time_layer(world, c, routing, a);
  } else {
    // One thread per GPU; each builds its world and layer (collective) and times its rank.
    std::vector<LayerTimes> per_rank(static_cast<size_t>(W));
    cli::on_each_gpu(W, heap, [&](comm::World& world, int rank) {
      per_rank[size_t(rank)] = time_layer(world, c, routing, a);
    });
    for (const LayerTimes& p : per_rank) {  // the slowest rank
      t.forward = std::max(t.forward, p.forward);
      t.backward = std::max(t.backward, p.backward);
      t.step = std::max(t.step, p.step);
    }
  }
  const double fwd_flops = c.shape.forward_flops(r.tokens_per_gpu);
  const double tokens = double(r.tokens_per_gpu);
  r.forward = {t.forward, fwd_flops, tokens};
  r.backward = {t.backward, 2.0 * fwd_flops, tokens};
  r.step = {t.step, 3.0 * fwd_flops, tokens};

  progress(a, "T=" + std::to_string(c.tokens_per_rank) + ": cuBLAS dense baseline");
  r.cublas = time_cublas(c, r.tokens_per_gpu, a, 0);
  if (W == 1) progress(a, "T=" + std::to_string(c.tokens_per_rank) + ": NCCL exchange + grouped-GEMM baseline");
  r.nccl = time_nccl_baseline(c, routing, a, 0);
  return r;
}

// ---- Output ---------------------------------------------------------------------------------------

nlohmann::json pass_json(const Pass& p) {
  return {{"ms", p.ms}, {"tflops", p.tflops()}, {"tokens_per_s", p.tokens_per_s()}};
}

nlohmann::json baseline_json(const Baseline& b, const RunResult& r) {
  if (!b.available) return {{"available", false}, {"note", b.note}};
  nlohmann::json j = {{"available", true},
                      {"note", b.note},
                      {"forward_ms", b.forward_ms},
                      {"backward_ms", b.backward_ms},
                      {"fwd_bwd_ms", b.step_ms()},
                      {"ratio_forward", b.forward_ms / r.forward.ms},
                      {"ratio_backward", b.backward_ms / r.backward.ms},
                      {"ratio_fwd_bwd", b.step_ms() / r.step.ms}};
  if (b.exchange_ms > 0.0) j["exchange_ms"] = b.exchange_ms;
  return j;
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

void print_run(const RunResult& r) {
  const auto row = [&](const char* name, const Pass& p, double cublas_ms, double nccl_ms) {
    std::string line = "  ";
    char head[64];
    std::snprintf(head, sizeof head, "%-8lld %-9s", static_cast<long long>(r.tokens_per_rank), name);
    line += head;
    line += fmt("%10.3f", p.ms) + fmt("%9.1f", p.tflops()) + fmt("%10.2f", p.tokens_per_s() * 1e-6);
    line += fmt("%11.3f", cublas_ms) + fmt("%8.2fx", cublas_ms / p.ms);
    if (r.nccl.available) {
      line += fmt("%12.3f", nccl_ms) + fmt("%8.2fx", nccl_ms / p.ms);
    } else {
      line += "           -        -";
    }
    std::cout << line << "\n";
  };
  row("forward", r.forward, r.cublas.forward_ms, r.nccl.forward_ms);
  row("backward", r.backward, r.cublas.backward_ms, r.nccl.backward_ms);
  row("fwd+bwd", r.step, r.cublas.step_ms(), r.nccl.step_ms());
}

int run(const Args& a) {
  // ---- Everything checkable without a GPU first.
  CARACAL_CHECK(a.precision == "bf16" || a.precision == "fp8", "--precision: expected bf16 or fp8, got '",
                a.precision, "'");
  CARACAL_CHECK(a.precision != "fp8", "--precision fp8: not implemented yet (MoELayer v1 runs bf16)");
  CARACAL_CHECK(a.backend == "loopback" || a.backend == "nccl", "--backend: expected loopback or nccl, got '",
                a.backend, "'");
  CARACAL_CHECK(a.warmup >= 0, "--warmup must be >= 0, got ", a.warmup);
  CARACAL_CHECK(a.reps >= 1, "--reps must be >= 1, got ", a.reps);
  CARACAL_CHECK(a.ep >= 1 && a.ep <= 64, "--ep must be in [1, 64], got ", a.ep);
  const ModelPreset* preset = a.shape.preset();
  LayerConfig base;
  base.shape = a.shape.shape();
  base.precision = Precision::kBF16;
  if (preset) base.router = preset->router;
  base.ep_size = a.ep;
  const std::vector<int64_t> tokens = a.sweep.empty() ? std::vector<int64_t>{a.tokens} : a.sweep;
  std::vector<LayerConfig> configs;
  for (int64_t t : tokens) {
    CARACAL_CHECK(t > 0, a.sweep.empty() ? "--tokens" : "--sweep", " must be positive, got ", t);
    LayerConfig c = base;
    c.tokens_per_rank = t;
    c.validate();
    (void)MoELayer::memory(c);  // throws for a configuration the layer cannot run
    configs.push_back(c);
  }
  RoutingSpec spec = parse_routing_spec(a.routing, "--routing");
  spec.seed = a.seed;
  if (spec.kind == RoutingKind::kAllToOne) {
    CARACAL_CHECK(spec.target_expert >= 0 && spec.target_expert < base.shape.num_experts, "--routing all-to-one: expert ",
                  spec.target_expert, " outside [0, ", base.shape.num_experts, ")");
  }

  // ---- The GPU.
  int devices = 0;
  const cudaError_t count_status = cudaGetDeviceCount(&devices);
  CARACAL_CHECK(count_status == cudaSuccess && devices > 0, "no GPU: caracal bench needs a Hopper (sm_90) GPU (",
                count_status == cudaSuccess ? std::string("no CUDA device found")
                                            : std::string("cudaGetDeviceCount: ") + cudaGetErrorString(count_status),
                "); `caracal plan` works without one");
  cudaDeviceProp prop{};
  check_cuda(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  CARACAL_CHECK(prop.major == 9 && prop.minor == 0, "caracal bench needs a Hopper (sm_90) GPU; GPU 0 is ",
                prop.name, " (sm_", prop.major, prop.minor, ")");
  const bool nccl = a.backend == "nccl";
  CARACAL_CHECK(!nccl || a.ep <= devices, "--backend nccl --ep ", a.ep, " needs ", a.ep, " GPUs, found ", devices,
                " (use the loopback backend for virtual ranks on one GPU)");

  nlohmann::json out;
  out["tool"] = "caracal bench";
  out["device"] = {{"name", prop.name}, {"sms", prop.multiProcessorCount}, {"count", devices}};
  out["model"] = preset ? nlohmann::json(preset->name) : nlohmann::json(nullptr);
  out["layer"] = {{"hidden", base.shape.hidden},
                  {"intermediate", base.shape.intermediate},
                  {"experts", base.shape.num_experts},
                  {"local_experts", base.local_experts()},
                  {"top_k", base.shape.top_k},
                  {"shared_experts", base.shape.num_shared_experts},
                  {"shared_intermediate", base.shape.shared_intermediate},
                  {"router", {{"normalize", base.router.normalize}, {"scale", base.router.scale}}}};
  out["ep"] = a.ep;
  out["backend"] = a.backend;
  out["routing"] = to_string(spec);
  out["seed"] = a.seed;
  out["precision"] = "bf16";
  out["warmup"] = a.warmup;
  out["reps"] = a.reps;
  out["exchange_sms"] = a.exchange_sms;  // 0: the default (all but 16)
  out["flops_note"] =
      "forward 6*T*k*D*I + 6*T*D*Is per rank, backward 2x; a loopback GPU runs all W ranks (W*T tokens)";

  std::cout << "Caracal bench: " << (preset ? preset->description + " (" + preset->name + ")" : std::string("custom shape"))
            << ", bf16, " << prop.name << " (" << prop.multiProcessorCount << " SMs)\n";
  std::cout << "  layer   D=" << base.shape.hidden << " I=" << base.shape.intermediate << " E=" << base.shape.num_experts
            << " k=" << base.shape.top_k << ", shared I=" << base.shape.shared_intermediate << "\n";
  std::cout << "  world   EP=" << a.ep << " " << a.backend << " (" << base.local_experts() << " experts per rank"
            << (nccl ? ", one GPU per rank" : ", all ranks on GPU 0") << "), routing " << to_string(spec)
            << ", warm-up " << a.warmup << ", median of " << a.reps << "\n";

  // ---- 1. Validation.
  nlohmann::json validation = {{"ran", !a.no_validate}};
  if (!a.no_validate) {
    const LayerConfig small = small_config(configs.front());
    const RoutingSpec small_spec = small_routing(spec, small);
    progress(a, "validating against the fp64 reference (D=" + std::to_string(small.shape.hidden) +
                    " I=" + std::to_string(small.shape.intermediate) + " E=" + std::to_string(small.shape.num_experts) +
                    " T=" + std::to_string(small.tokens_per_rank) + ")");
    ValidationResult v;
    std::string world_used;
    if (nccl && a.ep == 1) {
      std::vector<comm::NcclComm> comms = comm::init_all({0});
      comm::NcclWorld world(comms[0].get(), MoELayer::heap_bytes(small));
      v = validate_layer(small, small_spec, world, a.seed);
      world_used = "nccl";
    } else {
      comm::LoopbackWorld world(int(a.ep), MoELayer::heap_bytes(small), 0);
      v = validate_layer(small, small_spec, world, a.seed);
      world_used = "loopback";
    }
    double worst = 0.0;
    nlohmann::json errors = nlohmann::json::object();
    for (const auto& [name, err] : v.errors) {
      errors[name] = std::isfinite(err) ? nlohmann::json(err) : nlohmann::json("inf (NaN or unwritten output)");
      worst = std::max(worst, err);
    }
    validation["passed"] = v.passed;
    validation["world"] = world_used;
    validation["tolerance"] = v.tolerance;
    validation["max_error"] = std::isfinite(worst) ? nlohmann::json(worst) : nlohmann::json("inf");
    validation["config"] = {{"hidden", small.shape.hidden},          {"intermediate", small.shape.intermediate},
                            {"experts", small.shape.num_experts},    {"top_k", small.shape.top_k},
                            {"shared_intermediate", small.shape.shared_intermediate},
                            {"ep", small.ep_size},                   {"tokens_per_rank", small.tokens_per_rank}};
    validation["errors"] = errors;
    if (!v.passed) {
      out["validation"] = validation;
      if (!a.json.empty()) std::ofstream(a.json) << out.dump(2) << "\n";
      throw Error("validation against the fp64 reference failed (" + v.first_failure +
                  "): not timing; --no-validate skips the check");
    }
    char line[200];
    std::snprintf(line, sizeof line,
                  "  check   fp64 reference at D=%lld I=%lld E=%lld k=%lld T=%lld W=%lld (%s): passed, max relative error %.2e\n",
                  (long long)small.shape.hidden, (long long)small.shape.intermediate,
                  (long long)small.shape.num_experts, (long long)small.shape.top_k, (long long)small.tokens_per_rank,
                  (long long)small.ep_size, world_used.c_str(), worst);
    std::cout << line;
  } else {
    std::cout << "  check   skipped (--no-validate)\n";
  }
  out["validation"] = validation;

  // ---- 2. Timing.
  std::cout << "\n  T/rank   pass            ms  TFLOP/s  Mtok/s   cuBLAS ms  speedup   NCCL+GEMMs  speedup\n";
  std::cout << std::flush;
  nlohmann::json runs = nlohmann::json::array();
  for (const LayerConfig& c : configs) {
    progress(a, "T=" + std::to_string(c.tokens_per_rank) + ": timing the layer (warm-up " + std::to_string(a.warmup) +
                    ", " + std::to_string(a.reps) + " runs per pass)");
    const RunResult r = run_one(c, spec, a, devices);
    print_run(r);
    std::cout << std::flush;
    runs.push_back({{"tokens_per_rank", r.tokens_per_rank},
                    {"tokens_per_gpu", r.tokens_per_gpu},
                    {"forward", pass_json(r.forward)},
                    {"backward", pass_json(r.backward)},
                    {"fwd_bwd", pass_json(r.step)},
                    {"baselines", {{"cublas_dense", baseline_json(r.cublas, r)}, {"nccl_exchange_plus_gemms", baseline_json(r.nccl, r)}}}});
    out["runs"] = runs;
    if (!a.json.empty()) std::ofstream(a.json) << out.dump(2) << "\n";  // partial results survive a later failure
  }
  std::cout << "\n  ms: median of " << a.reps << " device-event-timed runs; TFLOP/s and Mtok/s per GPU"
            << (nccl ? "" : " (the GPU runs all W ranks: W*T tokens)")
            << "; speedup = baseline ms / ours.\n"
            << "  NCCL+GEMMs: host-synchronized NCCL exchange + the layer's grouped GEMMs on the rows it delivered\n"
            << "  (padded once, untimed), timed apart and summed (W = 1 only).\n";
  if (!a.json.empty()) {
    std::ofstream f(a.json);
    CARACAL_CHECK(static_cast<bool>(f), "--json: cannot write '", a.json, "'");
    f << out.dump(2) << "\n";
    CARACAL_CHECK(static_cast<bool>(f), "--json: failed writing '", a.json, "'");
  }
  return 0;
}

}  // namespace

}  // namespace caracal::bench_tool

int main(int argc, char** argv) {
  using caracal::bench_tool::Args;
  Args a;
  CLI::App app{"caracal bench: time MoELayer forward/backward on the GPU against the NCCL-exchange and cuBLAS baselines",
               "caracal bench"};
  caracal::cli::add_shape_options(app, a.shape);
  app.add_option("--ep", a.ep, "W: expert-parallel degree")->capture_default_str();
  app.add_option("--backend", a.backend, "loopback (W virtual ranks on GPU 0) | nccl (one GPU per rank)")
      ->capture_default_str();
  app.add_option("--tokens", a.tokens, "T: tokens per rank")->capture_default_str();
  app.add_option("--sweep", a.sweep, "Tokens per rank to sweep, comma-separated (replaces --tokens)")
      ->delimiter(',');
  app.add_option("--routing", a.routing, "uniform | zipf[:exponent] | all-to-one[:expert]")->capture_default_str();
  app.add_option("--seed", a.seed, "Seed of the routing and the data")->capture_default_str();
  app.add_option("--precision", a.precision, "bf16 | fp8 (fp8: not implemented yet)")->capture_default_str();
  app.add_option("--warmup", a.warmup, "Untimed runs per pass (at least; and at least 200 ms of them)")->capture_default_str();
  app.add_option("--reps", a.reps, "Timed runs per pass (the median is reported)")->capture_default_str();
  app.add_option("--json", a.json, "Write every result as JSON to this path");
  app.add_flag("--no-validate", a.no_validate, "Skip the fp64-reference check before timing");
  app.add_flag("--quiet", a.quiet, "No progress lines on stderr");
  app.add_option("--exchange-sms", a.exchange_sms, "SMs the token exchange may occupy (0: all but 16)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "caracal: error: bench: " << e.what() << " (see caracal bench --help)\n";
    return 2;
  }
  try {
    return caracal::bench_tool::run(a);
  } catch (const caracal::Error& e) {
    std::cerr << "caracal: error: bench: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "caracal: internal error: bench: " << e.what() << "\n";
    return 3;
  }
}
