// caracal_transfer_bench: the token exchange (DESIGN §2): the schedule build and the four transfers.
// Two backends (--backend):
//   loopback (default)  W virtual ranks on one GPU, each pass next to a device-to-device copy of the
//                       same bytes measured in the same run, and at W = 1 next to the NCCL baseline
//                       that learns the counts on the host (nccl_baseline_exchange.hpp);
//   nccl                W GPUs over NVLink, one host thread per GPU (transfer_bench_nccl.hpp): the
//                       bandwidth per GPU of the bytes that cross NVLink.
// How bytes are counted: transfer_bytes.hpp.
//
// Cases: every (model, routing, W) of the options; by default DeepSeek-V3 and Kimi K2, uniform
// and zipf:1.2 routing, W = 8 and W = 1, T = 4096 tokens per rank. Forward (dispatch, combine) and
// backward (reverse combine, reverse dispatch) run in separate worlds (ExchangeOptions) freed in
// between, so DeepSeek-V3 at W = 8 in loopback peaks at ~66 GB instead of ~132 GB; a direction's
// copies run before its world exists, from buffers freed before it is made.
// Per direction: inputs, checks and timing as in transfer_direction.hpp. In loopback one schedule
// launch builds all W ranks' tables on the one GPU.
// Exit status: 0 all checks passed; 2 a check failed; 1 an error (no GPU among them).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "caracal/comm/cuda_check.hpp"
#include "caracal/comm/cuda_memory.hpp"
#include "caracal/comm/loopback_world.hpp"
#include "caracal/comm/nccl_bootstrap.hpp"
#include "caracal/error.hpp"
#include "caracal/presets.hpp"
#include "caracal/routing.hpp"
#include "caracal/transfer/token_exchange.hpp"
#include "device_random.cuh"
#include "event_timer.hpp"
#include "nccl_baseline_exchange.hpp"
#include "transfer_bench_nccl.hpp"
#include "transfer_bytes.hpp"
#include "transfer_case.hpp"
#include "transfer_direction.hpp"
#include "transfer_report.hpp"
#include "transfer_spot_checks.hpp"

namespace caracal::bench {
namespace {

using transfer::ExchangeOptions;
using transfer::ExchangeShape;
using transfer::TokenExchange;

// A line of the loopback table; `token_exchange_ms` for the baseline's lines only.
Line loopback_line(const std::string& pass, double ms, double bytes, double copy_ms, double token_exchange_ms = 0.0) {
  return Line{pass, ms, bytes, copy_ms, token_exchange_ms, {}, {}};
}

// Median ms of a cudaMemcpyAsync D2D moving each of `bytes_moved` (half read, half written), from
// one source buffer into one destination buffer made here and freed on return.
std::vector<double> copy_ms(const std::vector<double>& bytes_moved, const Options& o, cudaStream_t stream) {
  const size_t most = static_cast<size_t>(*std::max_element(bytes_moved.begin(), bytes_moved.end()) / 2);
  auto src = comm::device_alloc<__nv_bfloat16>(most / 2 + 1, "cudaMalloc(copy source)");
  auto dst = comm::device_alloc<__nv_bfloat16>(most / 2 + 1, "cudaMalloc(copy destination)");
  fill_uniform(src.get(), most / 2 + 1, 7, -2.0f, 2.0f, stream);
  std::vector<double> ms;
  for (const double bytes : bytes_moved) {
    const size_t n = static_cast<size_t>(bytes / 2);
    ms.push_back(median_ms(stream, o.warmup, o.reps, [&] {
      check_cuda(cudaMemcpyAsync(dst.get(), src.get(), n, cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync(D2D)");
    }));
  }
  return ms;
}

// The NCCL baseline at W = 1 on the inputs of `ex`, after TokenExchange's forward passes ran on
// them (its expert_x is the reference). The baseline combines its own expert_x (an identity
// expert). Appends its two lines after TokenExchange's dispatch and combine lines.
void run_baseline(TokenExchange& ex, const Routing& routing, ncclComm_t comm, const Options& o, uint64_t seed,
                  const Stream& stream, DirectionResult& result) {
  const comm::World& world = ex.world();
  NcclBaselineExchange baseline(comm, ex.shape());
  auto y = comm::device_alloc<__nv_bfloat16>(static_cast<size_t>(ex.shape().tokens * ex.shape().hidden),
                                             "cudaMalloc(baseline y)");
  const int32_t* topk_idx = world.local_pointer(ex.schedule_buffers().topk_idx);
  const __nv_bfloat16* x = world.local_pointer(ex.forward_buffers().x);
  const float* gates = world.local_pointer(ex.router_buffers().gates);
  const auto dispatch = [&] { baseline.dispatch(topk_idx, x, stream.get()); };
  const auto combine = [&] { baseline.combine(baseline.expert_x(), gates, y.get(), stream.get()); };
  const Line ours_dispatch = result.lines[0];
  const Line ours_combine = result.lines[1];

  dispatch();
  stream.sync();
  require(check_baseline_dispatch(ex, baseline, seed));
  const double dispatch_ms = median_ms(stream.get(), o.warmup, o.reps, dispatch);
  require(check_baseline_dispatch(ex, baseline, seed + 1));
  combine();
  stream.sync();
  require(check_baseline_combine(ex, routing, y.get(), seed));
  const double combine_ms = median_ms(stream.get(), o.warmup, o.reps, combine);
  require(check_baseline_combine(ex, routing, y.get(), seed + 1));
  result.lines.push_back(loopback_line("nccl dispatch", dispatch_ms, ours_dispatch.bytes, ours_dispatch.copy_ms,
                                       ours_dispatch.ms));
  result.lines.push_back(loopback_line("nccl combine", combine_ms, ours_combine.bytes, ours_combine.copy_ms,
                                       ours_combine.ms));
}

// One direction of a case in loopback: copies, then the world, the schedule and the direction's
// two passes.
void run_loopback_direction(const ModelPreset& model, const Routing& routing, bool forward, const Options& o,
                            uint64_t seed, std::vector<comm::NcclComm>& nccl, DirectionResult& result) {
  const int W = static_cast<int>(routing.world_size);
  const ExchangeShape shape{o.tokens, model.shape.top_k, model.shape.hidden, model.shape.num_experts, kTileM};
  const std::vector<int64_t> rows_per_rank = schedule_rows_per_rank(routing, shape.num_experts, shape.tile_m);
  result.traffic = traffic_of(routing, shape, rows_per_rank, o.rows_per_route);
  const std::array<Pass, 2> passes = passes_of(forward);
  const std::vector<double> bytes{bytes_moved(passes[0], result.traffic), bytes_moved(passes[1], result.traffic)};
  Stream stream;
  const std::vector<double> copies = copy_ms(bytes, o, stream.get());

  const ExchangeOptions options = o.exchange_options(forward);
  const size_t heap = TokenExchange::heap_bytes(shape, W, options);
  result.heap_bytes = static_cast<double>(heap) * W;
  comm::LoopbackWorld world(W, heap);
  TokenExchange ex(world, shape, options);
  OneThreadRanks ranks(o.warmup, o.reps);
  ExchangeTimes times;
  const auto record = [&] {  // what was measured, also when a check failed half way
    result.schedule_us = 1e3 * times.schedule_ms;
    for (size_t i = 0; i < times.pass_ms.size(); ++i) {
      result.lines.push_back(loopback_line(name_of(passes[i]), times.pass_ms[i], bytes[i], copies[i]));
    }
  };
  try {
    run_exchange(ex, model, routing, rows_per_rank, seed, ranks, stream.get(), times);
  } catch (...) {
    record();
    throw;
  }
  record();

  if (forward && W == 1 && !o.no_baseline) {
    if (nccl.empty()) nccl = comm::init_all({world.device()});
    run_baseline(ex, routing, nccl[0].get(), o, seed, stream, result);
  }
}

// The devices to run on (GPU 0, or GPUs 0 .. W-1 for the nccl backend; Hopper all), or a message
// saying why there are none. `prop` is GPU 0's.
std::optional<std::string> find_hoppers(const Options& o, cudaDeviceProp& prop) {
  const int needed = o.nccl() ? *std::max_element(o.worlds.begin(), o.worlds.end()) : 1;
  const std::string nccl_needs = caracal::detail::concat("--backend nccl --world ", needed, " needs ", needed, " GPUs");
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    const std::string why = err != cudaSuccess ? cudaGetErrorString(err) : "no CUDA device";
    if (o.nccl()) return nccl_needs + ", found 0 (" + why + ")";
    return "no GPU (" + why + "): caracal_transfer_bench needs a Hopper (sm_90) GPU";
  }
  if (count < needed) return caracal::detail::concat(nccl_needs, ", found ", count);
  for (int d = needed - 1; d >= 0; --d) {
    check_cuda(cudaGetDeviceProperties(&prop, d), "cudaGetDeviceProperties");
    if (prop.major != 9 || prop.minor != 0) {
      return caracal::detail::concat("device ", d, " is ", prop.name,
                                     ": caracal_transfer_bench needs a Hopper (sm_90) GPU");
    }
  }
  check_cuda(cudaSetDevice(0), "cudaSetDevice");
  return std::nullopt;
}

int run(const Options& o) {
  cudaDeviceProp prop{};
  if (const auto missing = find_hoppers(o, prop)) {
    std::fprintf(stderr, "caracal_transfer_bench: %s\n", missing->c_str());
    return 1;
  }
  std::random_device fresh;
  const uint64_t seed = o.fixed_seed ? o.seed : (static_cast<uint64_t>(fresh()) << 32) ^ fresh();
  print_header(prop, o, seed);

  std::vector<comm::NcclComm> baseline_comm;  // loopback: made on first use (W = 1 with the baseline)
  NcclDirections nccl_directions;
  std::vector<DirectionResult> results;
  for (const std::string& model_name : o.models) {
    const ModelPreset& model = find_model_preset(model_name);
    for (const std::string& routing_text : o.routings) {
      RoutingSpec spec = parse_routing_spec(routing_text, "--routing");
      spec.seed = seed;
      for (const int W : o.worlds) {
        const Routing routing = make_routing(spec, W, o.tokens, model.shape.top_k, model.shape.num_experts);
        for (const bool forward : {true, false}) {
          DirectionResult r;
          r.model = model.name;
          r.routing = to_string(spec);
          r.world = W;
          r.direction = forward ? "forward" : "backward";
          try {
            if (o.nccl()) {
              nccl_directions.run(model, routing, forward, o, seed, r);
            } else {
              run_loopback_direction(model, routing, forward, o, seed, baseline_comm, r);
            }
          } catch (const CheckFailed& e) {
            r.error = e.what();
            r.check_failed = true;
          } catch (const std::exception& e) {
            r.error = e.what();
          }
          print_direction(r, o);
          results.push_back(std::move(r));
        }
      }
    }
  }
  if (!o.json_path.empty()) write_json(o.json_path, results, prop, o, seed);
  print_table(results, prop, o, seed);
  const bool failed_check = std::any_of(results.begin(), results.end(), [](const auto& r) { return r.check_failed; });
  const bool errored = std::any_of(results.begin(), results.end(), [](const auto& r) { return !r.error.empty(); });
  return failed_check ? 2 : errored ? 1 : 0;
}

}  // namespace
}  // namespace caracal::bench

int main(int argc, char** argv) {
  caracal::bench::Options o;
  CLI::App app{
      "caracal_transfer_bench: the token exchange's schedule build and four transfers, either in the loopback "
      "world on one GPU against a device-to-device copy of the same bytes and (at W = 1) the NCCL baseline "
      "exchange, or over NCCL on W GPUs (one per rank) as NVLink bandwidth per GPU"};
  app.add_option("--backend", o.backend,
                 "loopback: W virtual ranks on GPU 0; nccl: W GPUs (0 .. W-1) over NVLink, one host thread each")
      ->check(CLI::IsMember({"loopback", "nccl"}))
      ->capture_default_str();
  app.add_option("--model", o.models, "model presets (" + caracal::model_preset_names() + ")")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--routing", o.routings, "routings: uniform, zipf:<exponent>, all-to-one[:<expert>]")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--world", o.worlds, "EP degrees W (loopback: ranks on the one GPU; nccl: GPUs)")
      ->delimiter(',')
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--tokens", o.tokens, "tokens per rank (T)")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--warmup", o.warmup, "untimed runs before timing (at least; and at least 200 ms of them)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--reps", o.reps, "timed runs (the median is reported)")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  CLI::Option* seed = app.add_option("--seed", o.seed, "routing and data seed (default: a fresh one, printed)");
  app.add_flag("--no-baseline", o.no_baseline, "skip the NCCL baseline (loopback, at W = 1)");
  app.add_option("--exchange-sms", o.exchange_sms, "SMs the exchange kernels may occupy (0: all but 16)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_flag("--rows-per-route", o.rows_per_route,
               "a row per route both ways (as v1 did) instead of one per (token, rank): pulls and combine's pushes");
  app.add_option("--json", o.json_path, "also write every figure to this JSON file");
  CLI11_PARSE(app, argc, argv);
  o.fixed_seed = seed->count() > 0;
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // progress lines reach a log as they happen
  try {
    return caracal::bench::run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "caracal_transfer_bench: error: %s\n", e.what());
    return 1;
  }
}
