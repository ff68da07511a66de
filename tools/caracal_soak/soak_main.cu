// caracal-soak: many forward+backward steps of MoELayer with the routing changing every step, as a
// long training job would run it (issue 11). Per step (soak_steps.hpp): a fresh routing of one of
// five kinds in turn (uniform, Zipf 1.2, all-to-one, every route to rank 0's experts, uniform with
// 30% empty slots), fresh inputs, fp32 or bf16 weight gradients in turn, then check(), a checksum of
// every output of every rank, and the device memory in use (must stay flat). Besides (issue 45):
//   * --reference-every N: a step in every N against the fp64 reference, on a sample (soak_reference.hpp);
//   * --graph: each path's forward+backward captured into a CUDA graph and replayed (soak_runner.hpp);
//   * --path fused|v1|both: the layer's fused path, v1's separate launches, or both compared;
//   * --stall-at S (loopback): step S with the last rank stalled past a 200 ms timeout must fail,
//     poison its outputs and set the fault flag; then reset() and step S again, reference-checked.
//
// Output: one line per (step, rank[, path]) of checksums to --checksums FILE, the same for two runs
// with the same seed and options, for --graph or not, and for --stall-at or not (the stalled attempt
// writes none); a v1 line under --path both carries "v1" after the gradient type. A summary last,
// --json for the figures. Backends: loopback (--ep W virtual ranks on GPU 0) or nccl (one GPU per
// rank, one thread each).
// Exit status: 0 ok; 2 an error or a failed check (a reference or v1/fused mismatch, a stall that
// did not fail as it must, a memory change, a non-finite output); 1 bad arguments.
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "caracal/comm/cuda_check.hpp"
#include "caracal/comm/loopback_world.hpp"
#include "caracal/error.hpp"
#include "gpu_threads.hpp"
#include "soak_gather.hpp"
#include "soak_options.hpp"
#include "soak_report.hpp"
#include "soak_runner.hpp"
#include "soak_steps.hpp"

namespace caracal::soak {
namespace {

using LineKey = std::tuple<int64_t, int, int>;  // step, rank, path

size_t used_bytes(int device) {
  size_t free_bytes = 0, total = 0;
  check_cuda(cudaSetDevice(device), "cudaSetDevice");
  check_cuda(cudaMemGetInfo(&free_bytes, &total), "cudaMemGetInfo");
  return total - free_bytes;
}

void require_gpus(const SoakOptions& a) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  CARACAL_CHECK(status == cudaSuccess && count > 0, "no GPU: caracal-soak needs a Hopper (sm_90) GPU (",
                status == cudaSuccess ? std::string("no CUDA device found")
                                      : std::string("cudaGetDeviceCount: ") + cudaGetErrorString(status),
                ")");
  CARACAL_CHECK(!a.nccl() || a.ep <= count, "--backend nccl --ep ", a.ep, " needs ", a.ep, " GPUs, found ", count);
}

// Prints a failed check as it happens (the summary lists them again).
void report_failures(const std::vector<std::string>& failures) {
  for (const std::string& f : failures) std::cerr << "caracal-soak: FAILED: " << f << "\n";
}

// Every step on `world` (this thread's ranks); lines go to `lines`, the rest into `summary`.
void run_world(comm::World& world, const LayerConfig& c, const SoakOptions& a, ReferenceGather* gather,
               std::mutex& mutex, std::map<LineKey, std::string>& lines, Summary& summary, size_t gpu) {
  RankRunner runner(world, c, a, gather);
  size_t first_used = 0;
  // Memory is first read once every routing kind has run with both gradient types (kernels load
  // lazily, each module once; the graphs are captured by then), then compared with the end.
  const int64_t baseline_step = std::min<int64_t>(a.steps - 1, 2 * kKindCount - 1);
  for (int64_t s = 0; s < a.steps; ++s) {
    const Routing routing = step_routing(c, a.seed, s);
    if (s == a.stall_at) {
      StallOutcome stall = runner.stall(s, routing);
      const std::lock_guard<std::mutex> lock(mutex);
      report_failures(stall.failures);
      summary.failures.insert(summary.failures.end(), stall.failures.begin(), stall.failures.end());
      summary.stall = std::move(stall);
    }
    const bool reference = is_reference_step(s, a.reference_every) || s == a.stall_at;
    StepResult r = runner.step(s, routing, reference);
    if (s == baseline_step) first_used = used_bytes(world.device());
    const std::lock_guard<std::mutex> lock(mutex);
    for (auto& [key, line] : r.lines) lines[{s, key.first, key.second}] = std::move(line);
    summary.nonfinite += r.nonfinite;
    report_failures(r.failures);
    summary.failures.insert(summary.failures.end(), r.failures.begin(), r.failures.end());
    for (const auto& [name, n] : r.bitwise_equal) summary.bitwise_equal[name] += n;
    for (const auto& [name, l] : r.path_errors) summary.path_errors[name].add(l.error, l.bound);
    if (!r.reference.empty()) {
      ++summary.reference_checks;
      for (const OutputCheck& check : r.reference) summary.reference_errors[check.output].add(check.error, check.bound);
    }
    summary.replays += r.graph_replayed && gpu == 0 ? 1 : 0;
  }
  const size_t last_used = used_bytes(world.device());
  const std::lock_guard<std::mutex> lock(mutex);
  summary.memory[gpu] = {first_used, last_used};
}

int run(const SoakOptions& a) {
  const LayerConfig c = soak_config(a);
  require_gpus(a);
  const int W = int(a.ep);
  const size_t heap = heap_bytes(c, a.paths());
  std::unique_ptr<ReferenceGather> gather;
  if (a.reference_every > 0 || a.stalls()) gather = std::make_unique<ReferenceGather>(c);

  std::mutex mutex;
  std::map<LineKey, std::string> lines;
  Summary summary;
  summary.steps = a.steps;
  summary.memory.resize(a.nccl() ? size_t(W) : 1);
  const auto start = std::chrono::steady_clock::now();
  if (!a.nccl()) {
    comm::LoopbackWorld world(W, heap, 0);
    run_world(world, c, a, gather.get(), mutex, lines, summary, 0);
  } else {
    cli::on_each_gpu(W, heap, [&](comm::World& world, int rank) {
      run_world(world, c, a, gather.get(), mutex, lines, summary, size_t(rank));
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
  char hex[24];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(digest));
  print_summary(a, c, summary, hex);
  write_json(a, summary, hex);
  return passed(summary) ? 0 : 2;
}

}  // namespace
}  // namespace caracal::soak

int main(int argc, char** argv) {
  caracal::soak::SoakOptions a;
  CLI::App app{
      "caracal-soak: many MoELayer steps with changing routing; checksums of every output, checked "
      "against the fp64 reference every few steps"};
  caracal::soak::add_soak_options(app, a);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "caracal-soak: error: " << e.what() << " (see caracal-soak --help)\n";
    return 1;
  }
  try {
    caracal::soak::check_soak_options(a);
  } catch (const caracal::Error& e) {
    std::cerr << "caracal-soak: error: " << e.what() << "\n";
    return 1;
  }
  try {
    return caracal::soak::run(a);
  } catch (const std::exception& e) {
    std::cerr << "caracal-soak: error: " << e.what() << "\n";
    return 2;
  }
}
