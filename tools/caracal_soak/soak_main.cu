// caracal-soak: many forward+backward steps of MoELayer with the routing changing every step, as a
// long training job would run it (issue 11). Per step: a fresh routing of one of five kinds in
// turn (uniform, Zipf 1.2, all-to-one, every route to rank 0's experts, uniform with 30% empty
// slots), fresh inputs, fp32 or bf16 weight gradients in turn, then check(), a checksum of every
// output of every rank, and the device memory in use (must stay flat).
//
// Output: one line per (step, rank) of checksums to --checksums FILE (two runs with the same seed
// must write identical files: bitwise determinism), a summary last, --json for the figures.
// Backends: loopback (--ep W virtual ranks on GPU 0) or nccl (one GPU per rank, one thread each).
// Exit status: 0 ok; 2 an error, a memory change or a non-finite output; 1 bad arguments.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "caracal/comm/cuda_check.hpp"
#include "caracal/comm/cuda_memory.hpp"
#include "caracal/comm/loopback_world.hpp"
#include "caracal/error.hpp"
#include "caracal/moe_layer.hpp"
#include "caracal/routing.hpp"
#include "device_random.cuh"
#include "expert_weights.hpp"
#include "gpu_threads.hpp"

namespace caracal::soak {
namespace {

using bf16 = __nv_bfloat16;

struct Args {
  int64_t ep = 4;
  std::string backend = "loopback";
  int64_t steps = 1000;
  int64_t hidden = 1024, intermediate = 512, experts_per_rank = 8, top_k = 4, shared_intermediate = 512;
  int64_t tokens = 512;
  uint64_t seed = 1;
  std::string checksums, json;
};

constexpr const char* kKinds[] = {"uniform", "zipf:1.2", "all-to-one", "empty-ranks", "empty-slots"};
constexpr int kKindCount = 5;

// Step `step`'s routing of the whole world.
Routing step_routing(const LayerConfig& c, uint64_t seed, int64_t step) {
  RoutingSpec spec;
  spec.seed = seed * 7919 + static_cast<uint64_t>(step);
  const int kind = static_cast<int>(step % kKindCount);
  if (kind == 1) {
    spec.kind = RoutingKind::kZipf;
    spec.zipf_exponent = 1.2;
  } else if (kind == 2) {
    spec.kind = RoutingKind::kAllToOne;
    spec.target_expert = static_cast<int32_t>(step % c.shape.num_experts);
  } else if (kind == 4) {
    spec.empty_slot_fraction = 0.3;
  }
  Routing r = make_routing(spec, c.ep_size, c.tokens_per_rank, c.shape.top_k, c.shape.num_experts);
  if (kind == 3) {
    for (int32_t& id : r.topk_idx) id %= static_cast<int32_t>(c.local_experts());
  }
  return r;
}

// Sum over 8-byte words of word * (2i + 1), mod 2^64: integer sums commute, so the atomics give the
// same value whatever the order, and any changed bit changes it.
__global__ void checksum_kernel(const uint64_t* words, size_t count, unsigned long long* sum) {
  unsigned long long local = 0;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    local += static_cast<unsigned long long>(words[i]) * (2ull * i + 1ull);
  }
  atomicAdd(sum, local);
}

// Counts elements that are not finite (fp32 words or bf16 halves).
__global__ void nonfinite_kernel(const uint32_t* words, size_t count, bool bf16_data, unsigned long long* bad) {
  unsigned long long local = 0;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const uint32_t w = words[i];
    if (bf16_data) {
      local += ((w & 0x7F80u) == 0x7F80u) + ((w & 0x7F800000u) == 0x7F800000u);
    } else {
      local += (w & 0x7F800000u) == 0x7F800000u;
    }
  }
  atomicAdd(bad, local);
}

struct Output {
  const char* name;
  const void* data;
  size_t bytes;  // a multiple of 8
  bool bf16_data;
};

// One rank's device buffers.
struct RankBuffers {
  bench_tool::ExpertWeights weights;  // gradients in fp32 and bf16: the steps alternate
  comm::DeviceMemory<bf16> x, dy, y, dx;
  comm::DeviceMemory<int32_t> idx;
  comm::DeviceMemory<float> scores, d_scores;
};

size_t round8(size_t bytes) { return bytes / 8 * 8; }

class RankRunner {
 public:
  RankRunner(comm::World& world, const LayerConfig& c, const Args& a)
      : world_(world), c_(c), a_(a), layer_(c, world) {
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    const size_t T = size_t(c.tokens_per_rank), k = size_t(c.shape.top_k), D = size_t(c.shape.hidden);
    for (int l = 0; l < world.local_ranks(); ++l) {
      RankBuffers b;
      b.weights = bench_tool::make_expert_weights(c, a.seed * 1000003ull + uint64_t(world.first_local_rank() + l) * 64,
                                                  bench_tool::GradientBuffers::both, stream_);
      b.x = comm::device_alloc<bf16>(T * D, "x");
      b.dy = comm::device_alloc<bf16>(T * D, "dy");
      b.y = comm::device_alloc<bf16>(T * D, "y");
      b.dx = comm::device_alloc<bf16>(T * D, "dx");
      b.idx = comm::device_alloc<int32_t>(T * k, "topk_idx");
      b.scores = comm::device_alloc<float>(T * k, "topk_scores");
      b.d_scores = comm::device_alloc<float>(T * k, "d_topk_scores");
      ranks_.push_back(std::move(b));
    }
    sums_ = comm::device_alloc<unsigned long long>(64, "checksums");
    check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize(setup)");
  }
  ~RankRunner() { (void)cudaStreamDestroy(stream_); }
  RankRunner(const RankRunner&) = delete;
  RankRunner& operator=(const RankRunner&) = delete;

  // One step; returns a line per local rank: "step kind rank checksum..." and counts non-finite
  // outputs into *nonfinite.
  std::vector<std::string> step(int64_t s, const Routing& routing, uint64_t* nonfinite) {
    const size_t T = size_t(c_.tokens_per_rank), k = size_t(c_.shape.top_k), D = size_t(c_.shape.hidden);
    const size_t L = size_t(c_.local_experts()), I = size_t(c_.shape.intermediate),
                 Is = size_t(c_.shape.shared_intermediate);
    const bool has_shared = c_.shape.num_shared_experts > 0;
    const bool bf16_grads = s % 2 == 1;
    std::vector<MoEForwardArgs> fwd;
    std::vector<MoEBackwardArgs> bwd;
    for (int l = 0; l < world_.local_ranks(); ++l) {
      RankBuffers& b = ranks_[size_t(l)];
      const int rank = world_.first_local_rank() + l;
      const uint64_t seed = a_.seed * 104729ull + uint64_t(s) * 257 + uint64_t(rank) * 16;
      bench::fill_uniform(b.x.get(), T * D, seed + 1, -1.0f, 1.0f, stream_);
      bench::fill_uniform(b.dy.get(), T * D, seed + 2, -1.0f, 1.0f, stream_);
      bench::fill_uniform(b.scores.get(), T * k, seed + 3, 0.05f, 1.0f, stream_);
      check_cuda(cudaMemcpyAsync(b.idx.get(), routing.rank_topk(rank), T * k * sizeof(int32_t), cudaMemcpyHostToDevice,
                                 stream_),
                 "cudaMemcpyAsync(topk_idx)");
      MoEForwardArgs f;
      f.x = b.x.get();
      f.topk_idx = b.idx.get();
      f.topk_scores = b.scores.get();
      f.weights = b.weights.weights();
      f.y = b.y.get();
      fwd.push_back(f);
      MoEBackwardArgs g;
      g.dy = b.dy.get();
      g.dx = b.dx.get();
      g.d_topk_scores = b.d_scores.get();
      b.weights.set_gradients(g, bf16_grads);
      bwd.push_back(g);
    }
    const MoEContext context = layer_.forward(fwd, stream_);
    layer_.backward(bwd, context, stream_);

    std::vector<std::vector<Output>> outputs(size_t(world_.local_ranks()));
    for (int l = 0; l < world_.local_ranks(); ++l) {
      const MoEBackwardArgs& g = bwd[size_t(l)];
      std::vector<Output>& o = outputs[size_t(l)];
      o.push_back({"y", fwd[size_t(l)].y, round8(T * D * 2), true});
      o.push_back({"dx", g.dx, round8(T * D * 2), true});
      o.push_back({"d_scores", g.d_topk_scores, round8(T * k * 4), false});
      const size_t eb = bf16_grads ? 2 : 4;
      o.push_back({"d_w_gate_up", bf16_grads ? static_cast<const void*>(g.d_w_gate_up_bf16) : g.d_w_gate_up,
                   round8(L * 2 * I * D * eb), bf16_grads});
      o.push_back({"d_w_down", bf16_grads ? static_cast<const void*>(g.d_w_down_bf16) : g.d_w_down,
                   round8(L * D * I * eb), bf16_grads});
      if (has_shared) {
        o.push_back({"d_shared_w_gate_up",
                     bf16_grads ? static_cast<const void*>(g.d_shared_w_gate_up_bf16) : g.d_shared_w_gate_up,
                     round8(2 * Is * D * eb), bf16_grads});
        o.push_back({"d_shared_w_down", bf16_grads ? static_cast<const void*>(g.d_shared_w_down_bf16) : g.d_shared_w_down,
                     round8(D * Is * eb), bf16_grads});
      }
    }
    size_t slot = 0;
    check_cuda(cudaMemsetAsync(sums_.get(), 0, 64 * sizeof(unsigned long long), stream_), "cudaMemsetAsync(sums)");
    for (const auto& rank_outputs : outputs) {
      for (const Output& out : rank_outputs) {
        checksum_kernel<<<264, 256, 0, stream_>>>(static_cast<const uint64_t*>(out.data), out.bytes / 8,
                                                  sums_.get() + slot);
        nonfinite_kernel<<<264, 256, 0, stream_>>>(static_cast<const uint32_t*>(out.data), out.bytes / 4,
                                                   out.bf16_data, sums_.get() + 32 + slot);
        check_cuda(cudaGetLastError(), "checksum kernels");
        ++slot;
      }
    }
    CARACAL_CHECK(slot <= 32, "caracal-soak: more outputs than checksum slots");
    std::vector<unsigned long long> host(64);
    check_cuda(cudaMemcpyAsync(host.data(), sums_.get(), 64 * sizeof(unsigned long long), cudaMemcpyDeviceToHost,
                               stream_),
               "cudaMemcpyAsync(sums)");
    check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize(step)");
    layer_.check();

    std::vector<std::string> lines;
    slot = 0;
    for (int l = 0; l < world_.local_ranks(); ++l) {
      std::string line = std::to_string(s) + " " + kKinds[s % kKindCount] + " rank " +
                         std::to_string(world_.first_local_rank() + l) + (bf16_grads ? " bf16" : " fp32");
      for (const Output& out : outputs[size_t(l)]) {
        char hex[24];
        std::snprintf(hex, sizeof hex, " %016llx", host[slot]);
        line += std::string(" ") + out.name + hex;
        *nonfinite += host[32 + slot];
        ++slot;
      }
      lines.push_back(line);
    }
    return lines;
  }

 private:
  comm::World& world_;
  LayerConfig c_;
  Args a_;
  MoELayer layer_;
  cudaStream_t stream_ = nullptr;
  std::vector<RankBuffers> ranks_;
  comm::DeviceMemory<unsigned long long> sums_;
};

size_t used_bytes(int device) {
  size_t free_bytes = 0, total = 0;
  check_cuda(cudaSetDevice(device), "cudaSetDevice");
  check_cuda(cudaMemGetInfo(&free_bytes, &total), "cudaMemGetInfo");
  return total - free_bytes;
}

struct Summary {
  int64_t steps = 0;
  uint64_t nonfinite = 0;
  std::vector<std::pair<size_t, size_t>> memory;  // per GPU: used after the warm-up steps, after the last
  double seconds = 0.0;
  std::vector<std::string> errors;
};

// Runs every step on `world` (this thread's ranks); lines go to `lines` keyed by (step, rank).
void run_world(comm::World& world, const LayerConfig& c, const Args& a, std::mutex& mutex,
               std::map<std::pair<int64_t, int>, std::string>& lines, Summary& summary, size_t gpu) {
  RankRunner runner(world, c, a);
  uint64_t nonfinite = 0;
  size_t first_used = 0;
  // Memory is first read once every routing kind has run with both gradient types (kernels load
  // lazily, each module once), then compared with the end.
  const int64_t baseline_step = std::min<int64_t>(a.steps - 1, 2 * kKindCount - 1);
  for (int64_t s = 0; s < a.steps; ++s) {
    const Routing routing = step_routing(c, a.seed, s);
    const std::vector<std::string> out = runner.step(s, routing, &nonfinite);
    if (s == baseline_step) first_used = used_bytes(world.device());
    std::lock_guard<std::mutex> lock(mutex);
    for (size_t l = 0; l < out.size(); ++l) lines[{s, world.first_local_rank() + int(l)}] = out[l];
  }
  const size_t last_used = used_bytes(world.device());
  std::lock_guard<std::mutex> lock(mutex);
  summary.nonfinite += nonfinite;
  summary.memory[gpu] = {first_used, last_used};
}

int run(const Args& a) {
  LayerConfig c;
  c.shape.hidden = a.hidden;
  c.shape.intermediate = a.intermediate;
  c.shape.num_experts = a.experts_per_rank * a.ep;
  c.shape.top_k = a.top_k;
  c.shape.num_shared_experts = a.shared_intermediate > 0 ? 1 : 0;
  c.shape.shared_intermediate = a.shared_intermediate;
  c.ep_size = a.ep;
  c.tokens_per_rank = a.tokens;
  c.validate();
  const bool nccl = a.backend == "nccl";
  const int W = int(a.ep);
  const size_t heap = MoELayer::heap_bytes(c);

  std::mutex mutex;
  std::map<std::pair<int64_t, int>, std::string> lines;
  Summary summary;
  summary.steps = a.steps;
  summary.memory.resize(nccl ? size_t(W) : 1);
  const auto start = std::chrono::steady_clock::now();
  if (!nccl) {
    comm::LoopbackWorld world(W, heap, 0);
    run_world(world, c, a, mutex, lines, summary, 0);
  } else {
    cli::on_each_gpu(W, heap, [&](comm::World& world, int rank) {
      run_world(world, c, a, mutex, lines, summary, size_t(rank));
    });
  }
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  // FNV-1a over every line: one value two runs can compare.
  uint64_t digest = 1469598103934665603ull;
  std::ofstream file;
  if (!a.checksums.empty()) file.open(a.checksums);
  for (const auto& [key, line] : lines) {
    if (file) file << line << "\n";
    for (const char ch : line) digest = (digest ^ static_cast<unsigned char>(ch)) * 1099511628211ull;
  }
  bool memory_flat = true;
  for (const auto& [first, last] : summary.memory) memory_flat = memory_flat && first == last;

  char hex[24];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(digest));
  std::cout << "caracal-soak: " << a.backend << " W=" << W << ", " << a.steps << " steps (routing " << kKinds[0]
            << ", " << kKinds[1] << ", " << kKinds[2] << ", " << kKinds[3] << ", " << kKinds[4]
            << " in turn; fp32 and bf16 weight gradients in turn), D=" << a.hidden << " I=" << a.intermediate
            << " E=" << c.shape.num_experts << " k=" << a.top_k << " shared I=" << a.shared_intermediate
            << " T=" << a.tokens << "\n";
  std::cout << "  errors: 0 (check() after every step)\n";
  std::cout << "  non-finite output elements: " << summary.nonfinite << "\n";
  for (size_t g = 0; g < summary.memory.size(); ++g) {
    std::cout << "  GPU " << g << " memory in use after step " << std::min<int64_t>(a.steps, 2 * kKindCount) << ": " << summary.memory[g].first << " bytes, after the last: "
              << summary.memory[g].second << " bytes" << (summary.memory[g].first == summary.memory[g].second ? " (flat)" : " (CHANGED)")
              << "\n";
  }
  std::cout << "  " << summary.seconds << " s, " << double(a.steps) / summary.seconds << " steps/s\n";
  std::cout << "  digest of every output checksum: " << hex << "\n";
  if (!a.json.empty()) {
    nlohmann::json j = {{"backend", a.backend}, {"ep", W}, {"steps", a.steps}, {"seed", a.seed},
                        {"nonfinite", summary.nonfinite}, {"memory_flat", memory_flat},
                        {"seconds", summary.seconds}, {"digest", hex}};
    std::ofstream(a.json) << j.dump(2) << "\n";
  }
  return summary.nonfinite == 0 && memory_flat ? 0 : 2;
}

}  // namespace
}  // namespace caracal::soak

int main(int argc, char** argv) {
  caracal::soak::Args a;
  CLI::App app{"caracal-soak: many MoELayer steps with changing routing; checksums of every output"};
  app.add_option("--ep", a.ep, "W: expert-parallel degree")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--backend", a.backend, "loopback (W virtual ranks on GPU 0) | nccl (one GPU per rank)")
      ->check(CLI::IsMember({"loopback", "nccl"}))
      ->capture_default_str();
  app.add_option("--steps", a.steps, "forward+backward steps")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--hidden", a.hidden, "D")->capture_default_str();
  app.add_option("--intermediate", a.intermediate, "I")->capture_default_str();
  app.add_option("--experts-per-rank", a.experts_per_rank, "E / W")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--top-k", a.top_k, "k")->capture_default_str();
  app.add_option("--shared-intermediate", a.shared_intermediate, "I of the shared expert (0: none)")
      ->capture_default_str();
  app.add_option("--tokens", a.tokens, "T per rank")->capture_default_str();
  app.add_option("--seed", a.seed, "seed of the routings, inputs and weights")->capture_default_str();
  app.add_option("--checksums", a.checksums, "write one line of checksums per (step, rank) to this file");
  app.add_option("--json", a.json, "write the summary as JSON to this file");
  CLI11_PARSE(app, argc, argv);
  try {
    return caracal::soak::run(a);
  } catch (const std::exception& e) {
    std::cerr << "caracal-soak: error: " << e.what() << "\n";
    return 2;
  }
}
