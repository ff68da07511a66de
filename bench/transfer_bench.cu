// caracal_transfer_bench: the token exchange (DESIGN §2) on one GPU in the loopback world: the
// schedule build and the four transfers, each next to a device-to-device copy of the same bytes
// measured in the same run, and at W = 1 next to the NCCL baseline that learns the counts on the
// host (nccl_baseline_exchange.hpp). How bytes are counted: transfer_bytes.hpp.
//
// Cases: every (model, routing, W) of the options; by default DeepSeek-V3 and Kimi K2, uniform
// and zipf:1.2 routing, W = 8 and W = 1, T = 4096 tokens per rank. Forward (dispatch, combine) and
// backward (reverse combine, reverse dispatch) run in separate worlds (ExchangeOptions) freed in
// between, so DeepSeek-V3 at W = 8 peaks at ~66 GB instead of ~132 GB; a direction's copies run
// before its world exists, from buffers freed before it is made.
// Per direction: fresh random inputs (bf16 in [-2, 2), scores in [0.05, 1)); the schedule built and
// its row counts checked against the host's; each pass run once and spot-checked
// (transfer_spot_checks.hpp), timed (median of --reps CUDA-event-bracketed runs after --warmup),
// and checked again. In loopback one schedule launch builds all W ranks' tables on the one GPU.
// Exit status: 0 all checks passed; 2 a check failed; 1 an error (no GPU among them).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <stdexcept>
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
#include "transfer_bytes.hpp"
#include "transfer_spot_checks.hpp"

namespace caracal::bench {
namespace {

using transfer::ExchangeOptions;
using transfer::ExchangeShape;
using transfer::TokenExchange;

constexpr int64_t kTileM = 128;  // expert segments padded to the grouped GEMM's M tile

struct Options {
  std::vector<std::string> models{"deepseek-v3", "kimi-k2"};
  std::vector<std::string> routings{"uniform", "zipf:1.2"};
  std::vector<int> worlds{8, 1};
  int64_t tokens = 4096;
  int warmup = 5;
  int reps = 30;
  uint64_t seed = 0;
  bool fixed_seed = false;  // --seed given
  bool no_baseline = false;
  std::string json_path;
};

// A spot check found a wrong value (exit status 2, not 1).
struct CheckFailed : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void require(const std::string& mismatch) {
  if (!mismatch.empty()) throw CheckFailed(mismatch);
}

// One line of the table.
struct Line {
  std::string pass;
  double ms = 0.0;
  double bytes = 0.0;              // bytes moved by TokenExchange's pass (baseline lines too: the same rows)
  double copy_ms = 0.0;            // a D2D copy moving `bytes`
  double token_exchange_ms = 0.0;  // baseline lines: TokenExchange's pass on the same data
};

// One direction of one (model, routing, W) case.
struct DirectionResult {
  std::string model, routing, direction;
  int world = 0;
  RowTraffic traffic;
  double heap_bytes = 0.0;  // all ranks' symmetric heaps
  double schedule_us = 0.0;
  std::vector<Line> lines;
  std::string error;  // set when the direction did not complete
  bool check_failed = false;
};

// Rows each receiving rank's schedule holds: its experts' routes, each expert padded to kTileM.
std::vector<int64_t> schedule_rows_per_rank(const Routing& routing, int64_t num_experts) {
  std::vector<int64_t> per_expert(static_cast<size_t>(num_experts), 0);
  for (const int32_t id : routing.topk_idx) {
    if (id >= 0 && id < num_experts) ++per_expert[static_cast<size_t>(id)];
  }
  const int64_t local = num_experts / routing.world_size;
  std::vector<int64_t> rows(static_cast<size_t>(routing.world_size), 0);
  for (int64_t e = 0; e < num_experts; ++e) {
    rows[static_cast<size_t>(e / local)] += (per_expert[static_cast<size_t>(e)] + kTileM - 1) / kTileM * kTileM;
  }
  return rows;
}

RowTraffic traffic_of(const Routing& routing, const ExchangeShape& shape, const std::vector<int64_t>& rows_per_rank) {
  RowTraffic t;
  t.routed = std::count_if(routing.topk_idx.begin(), routing.topk_idx.end(),
                           [&](int32_t id) { return id >= 0 && id < shape.num_experts; });
  for (const int64_t rows : rows_per_rank) t.padded_rows += rows;
  t.tokens = routing.world_size * routing.tokens_per_rank;
  t.row_bytes = 2 * shape.hidden;
  return t;
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

// Random inputs of every rank for one direction; topk_idx from the routing.
void fill_inputs(TokenExchange& ex, const Routing& routing, uint64_t seed, cudaStream_t stream) {
  const comm::World& world = ex.world();
  const size_t routes = static_cast<size_t>(ex.sizes().routes);
  const size_t token_values = static_cast<size_t>(ex.shape().tokens * ex.shape().hidden);
  const size_t row_capacity = static_cast<size_t>(ex.sizes().row_capacity);
  const size_t expert_values = row_capacity * static_cast<size_t>(ex.shape().hidden);
  for (int r = 0; r < world.world_size(); ++r) {
    const uint64_t s = seed + 16 * static_cast<uint64_t>(r);
    check_cuda(cudaMemcpyAsync(world.local_pointer(ex.schedule_buffers().topk_idx, r), routing.rank_topk(r),
                               routes * sizeof(int32_t), cudaMemcpyHostToDevice, stream),
               "cudaMemcpyAsync(topk_idx)");
    fill_uniform(world.local_pointer(ex.router_buffers().topk_scores, r), routes, s + 1, 0.05f, 1.0f, stream);
    if (ex.options().forward) {
      fill_uniform(world.local_pointer(ex.forward_buffers().x, r), token_values, s + 2, -2.0f, 2.0f, stream);
      fill_uniform(world.local_pointer(ex.forward_buffers().expert_out, r), expert_values, s + 3, -2.0f, 2.0f, stream);
    }
    if (ex.options().backward) {
      fill_uniform(world.local_pointer(ex.backward_buffers().dy, r), token_values, s + 4, -2.0f, 2.0f, stream);
      fill_uniform(world.local_pointer(ex.backward_buffers().expert_dx, r), expert_values, s + 5, -2.0f, 2.0f, stream);
      fill_uniform(world.local_pointer(ex.backward_buffers().expert_dg, r), row_capacity, s + 6, -1.0f, 1.0f, stream);
    }
  }
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize(inputs)");  // the topk_idx copies are pageable
}

class Stream {
 public:
  Stream() { check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags"); }
  ~Stream() { (void)cudaStreamDestroy(stream_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }
  void sync() const { check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }

 private:
  cudaStream_t stream_ = nullptr;
};

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
  result.lines.push_back({"nccl dispatch", dispatch_ms, ours_dispatch.bytes, ours_dispatch.copy_ms, ours_dispatch.ms});
  result.lines.push_back({"nccl combine", combine_ms, ours_combine.bytes, ours_combine.copy_ms, ours_combine.ms});
}

// One direction of a case: copies, then the world, the schedule and the direction's two passes.
void run_direction(const ModelPreset& model, const Routing& routing, bool forward, const Options& o, uint64_t seed,
                   std::vector<comm::NcclComm>& nccl, DirectionResult& result) {
  const int W = static_cast<int>(routing.world_size);
  const ExchangeShape shape{o.tokens, model.shape.top_k, model.shape.hidden, model.shape.num_experts, kTileM};
  const std::vector<int64_t> rows_per_rank = schedule_rows_per_rank(routing, shape.num_experts);
  result.traffic = traffic_of(routing, shape, rows_per_rank);
  const Pass passes[2] = {forward ? Pass::kDispatch : Pass::kReverseCombine,
                          forward ? Pass::kCombine : Pass::kReverseDispatch};
  const std::vector<double> bytes{bytes_moved(passes[0], result.traffic), bytes_moved(passes[1], result.traffic)};
  Stream stream;
  const std::vector<double> copies = copy_ms(bytes, o, stream.get());

  const ExchangeOptions options{forward, !forward, false};
  const size_t heap = TokenExchange::heap_bytes(shape, W, options);
  result.heap_bytes = static_cast<double>(heap) * W;
  comm::LoopbackWorld world(W, heap);
  TokenExchange ex(world, shape, options);
  fill_inputs(ex, routing, seed, stream.get());

  ex.build_schedule(stream.get());
  ex.compute_gates(model.router, stream.get());
  stream.sync();
  ex.check();
  require(check_total_rows(ex, rows_per_rank));
  result.schedule_us = 1e3 * median_ms(stream.get(), o.warmup, o.reps, [&] { ex.build_schedule(stream.get()); });
  ex.check();
  require(check_total_rows(ex, rows_per_rank));

  for (int i = 0; i < 2; ++i) {
    const Pass pass = passes[i];
    const auto run = [&] {
      switch (pass) {
        case Pass::kDispatch:
          ex.dispatch(stream.get());
          break;
        case Pass::kCombine:
          ex.combine(stream.get());
          break;
        case Pass::kReverseCombine:
          ex.reverse_combine(stream.get());
          break;
        case Pass::kReverseDispatch:
          ex.reverse_dispatch(model.router, stream.get());
          break;
      }
    };
    const auto check = [&](uint64_t s) {
      stream.sync();
      ex.check();
      const bool pull = pass == Pass::kDispatch || pass == Pass::kReverseCombine;
      require(pull ? check_pull(ex, routing, pass == Pass::kReverseCombine, s)
                   : check_slot_sum(ex, routing, pass == Pass::kReverseDispatch, s));
    };
    run();
    check(seed);
    const double ms = median_ms(stream.get(), o.warmup, o.reps, run);
    check(seed + 1);
    result.lines.push_back({name_of(pass), ms, bytes[static_cast<size_t>(i)], copies[static_cast<size_t>(i)], 0.0});
  }

  if (forward && W == 1 && !o.no_baseline) {
    if (nccl.empty()) nccl = comm::init_all({world.device()});
    run_baseline(ex, routing, nccl[0].get(), o, seed, stream, result);
  }
}

// ---- Output ------------------------------------------------------------------------------------

double gbps(double bytes, double ms) { return bytes / (ms * 1e6); }

void print_direction(const DirectionResult& r) {
  std::printf("%s %s W=%d %s: heap %.1f GB, routed %lld, padded rows %lld, schedule %.1f us\n", r.model.c_str(),
              r.routing.c_str(), r.world, r.direction.c_str(), r.heap_bytes / 1e9,
              static_cast<long long>(r.traffic.routed), static_cast<long long>(r.traffic.padded_rows), r.schedule_us);
  for (const Line& l : r.lines) {
    std::printf("  %-17s %8.3f ms %9.1f GB/s  (copy %.3f ms, %.1f GB/s; %.3f GB moved)\n", l.pass.c_str(), l.ms,
                gbps(l.bytes, l.ms), l.copy_ms, gbps(l.bytes, l.copy_ms), l.bytes / 1e9);
  }
  if (!r.error.empty()) std::printf("  %s: %s\n", r.check_failed ? "CHECK FAILED" : "ERROR", r.error.c_str());
}

void print_table(const std::vector<DirectionResult>& results, const cudaDeviceProp& prop, const Options& o,
                 uint64_t seed) {
  std::printf("\n==== caracal_transfer_bench summary: %s, T=%lld tokens/rank, median of %d runs, seed %llu\n",
              prop.name, static_cast<long long>(o.tokens), o.reps, static_cast<unsigned long long>(seed));
  std::printf(
      "GB/s = row payload read+written per pass, all ranks (pull: (routed+padded rows)*2D; push+sum: "
      "(3*routed+tokens)*2D); copy = one D2D cudaMemcpyAsync moving the same bytes; ratio = copy ms / ms. "
      "sched us = one build_schedule launch (loopback: all W ranks' tables on the one GPU). nccl lines: the "
      "NCCL baseline (the host learns the counts) on TokenExchange's bytes, last column = its ms / "
      "TokenExchange's ms.\n");
  std::printf("%-12s %-9s %2s %-17s %8s %8s %9s %6s %9s\n", "model", "routing", "W", "pass", "ms", "GB/s", "copy GB/s",
              "ratio", "sched us");
  for (const DirectionResult& r : results) {
    for (const Line& l : r.lines) {
      const bool baseline = l.token_exchange_ms > 0.0;
      char last[32];
      if (baseline) {
        std::snprintf(last, sizeof last, "x%.2f", l.ms / l.token_exchange_ms);
      } else {
        std::snprintf(last, sizeof last, "%.1f", r.schedule_us);
      }
      std::printf("%-12s %-9s %2d %-17s %8.3f %8.1f %9.1f %6.3f %9s\n", r.model.c_str(), r.routing.c_str(), r.world,
                  l.pass.c_str(), l.ms, gbps(l.bytes, l.ms), gbps(l.bytes, l.copy_ms), l.copy_ms / l.ms, last);
    }
    if (!r.error.empty()) {
      std::printf("%-12s %-9s %2d %-17s %s: %s\n", r.model.c_str(), r.routing.c_str(), r.world, r.direction.c_str(),
                  r.check_failed ? "CHECK FAILED" : "ERROR", r.error.c_str());
    }
  }
}

void write_json(const std::string& path, const std::vector<DirectionResult>& results, const cudaDeviceProp& prop,
                const Options& o, uint64_t seed) {
  nlohmann::json cases = nlohmann::json::array();
  for (const DirectionResult& r : results) {
    nlohmann::json lines = nlohmann::json::array();
    for (const Line& l : r.lines) {
      nlohmann::json j = {{"pass", l.pass},
                          {"ms", l.ms},
                          {"bytes_moved", l.bytes},
                          {"gb_per_s", gbps(l.bytes, l.ms)},
                          {"copy_ms", l.copy_ms},
                          {"copy_gb_per_s", gbps(l.bytes, l.copy_ms)},
                          {"ratio_to_copy", l.copy_ms / l.ms}};
      if (l.token_exchange_ms > 0.0) j["token_exchange_ms"] = l.token_exchange_ms;
      lines.push_back(j);
    }
    cases.push_back({{"model", r.model},
                     {"routing", r.routing},
                     {"world", r.world},
                     {"direction", r.direction},
                     {"routed_rows", r.traffic.routed},
                     {"padded_rows", r.traffic.padded_rows},
                     {"tokens", r.traffic.tokens},
                     {"row_bytes", r.traffic.row_bytes},
                     {"heap_bytes", r.heap_bytes},
                     {"schedule_us", r.schedule_us},
                     {"passes", lines},
                     {"error", r.error},
                     {"check_failed", r.check_failed}});
  }
  const nlohmann::json out = {
      {"device", prop.name},
      {"sms", prop.multiProcessorCount},
      {"tokens_per_rank", o.tokens},
      {"tile_m", kTileM},
      {"warmup", o.warmup},
      {"reps", o.reps},
      {"seed", seed},
      {"bytes_counted",
       "row payload read + written, all ranks, 2*D bytes per row: dispatch and reverse_combine "
       "(routed + padded_rows) rows, combine and reverse_dispatch (3 * routed + tokens) rows; the copy is one "
       "D2D cudaMemcpyAsync of half those bytes (read once, written once); nccl lines use TokenExchange's bytes"},
      {"cases", cases}};
  std::ofstream file(path);
  CARACAL_CHECK(file.good(), "cannot write --json ", path);
  file << out.dump(1) << '\n';
}

// The device to run on, or a message saying why there is none.
std::optional<std::string> find_hopper(cudaDeviceProp& prop) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    return std::string("no GPU (") + (err != cudaSuccess ? cudaGetErrorString(err) : "no CUDA device") +
           "): caracal_transfer_bench needs a Hopper (sm_90) GPU";
  }
  check_cuda(cudaSetDevice(0), "cudaSetDevice");
  check_cuda(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  if (prop.major != 9 || prop.minor != 0) {
    return std::string("device 0 is ") + prop.name + ": caracal_transfer_bench needs a Hopper (sm_90) GPU";
  }
  return std::nullopt;
}

int run(const Options& o) {
  cudaDeviceProp prop{};
  if (const auto missing = find_hopper(prop)) {
    std::fprintf(stderr, "caracal_transfer_bench: %s\n", missing->c_str());
    return 1;
  }
  std::random_device fresh;
  const uint64_t seed = o.fixed_seed ? o.seed : (static_cast<uint64_t>(fresh()) << 32) ^ fresh();
  std::printf(
      "caracal_transfer_bench: %s, %d SMs; T=%lld tokens/rank, tile_m %lld, median of %d runs after %d "
      "warm-up, seed %llu (--seed to replay)\n",
      prop.name, prop.multiProcessorCount, static_cast<long long>(o.tokens), static_cast<long long>(kTileM), o.reps,
      o.warmup, static_cast<unsigned long long>(seed));

  std::vector<comm::NcclComm> nccl;  // made on first use (W = 1 with the baseline)
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
            run_direction(model, routing, forward, o, seed, nccl, r);
          } catch (const CheckFailed& e) {
            r.error = e.what();
            r.check_failed = true;
          } catch (const std::exception& e) {
            r.error = e.what();
          }
          print_direction(r);
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
      "caracal_transfer_bench: the token exchange's schedule build and four transfers in the loopback world on one "
      "GPU, against a device-to-device copy of the same bytes and (at W = 1) the NCCL baseline exchange"};
  app.add_option("--model", o.models, "model presets (" + caracal::model_preset_names() + ")")->capture_default_str();
  app.add_option("--routing", o.routings, "routings: uniform, zipf:<exponent>, all-to-one[:<expert>]")
      ->capture_default_str();
  app.add_option("--world", o.worlds, "EP degrees W (loopback ranks on the one GPU)")
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
  app.add_flag("--no-baseline", o.no_baseline, "skip the NCCL baseline (it runs at W = 1)");
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
