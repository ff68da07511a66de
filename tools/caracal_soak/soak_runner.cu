#include <algorithm>
#include <cmath>
#include <sstream>
#include <thread>

#include "caracal/bf16.hpp"
#include "caracal/comm/cuda_check.hpp"
#include "caracal/error.hpp"
#include "caracal/schedule.hpp"
#include "device_random.cuh"
#include "soak_runner.hpp"
#include "soak_steps.hpp"

namespace caracal::soak {

using bf16 = __nv_bfloat16;

namespace {

constexpr size_t kMaxOutputs = 7;  // y, dx, d_topk_scores, two routed and two shared weight gradients

// "step 150 (zipf:1.2, bf16 weight gradients)"
std::string step_name(int64_t s) {
  return "step " + std::to_string(s) + " (" + kind_of(s) + ", " + (bf16_gradients(s) ? "bf16" : "fp32") +
         " weight gradients)";
}

std::string sci(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3g", v);
  return text;
}

// Whether the ring of `ring_rows` holds every rank's rows of `routing` in one macrobatch: the fused
// path's y is then v1's to the bit (the GPU tests' ring_holds_step).
bool ring_holds_step(const LayerConfig& c, const Routing& routing, int64_t ring_rows) {
  if (ring_rows == 0) return true;  // no ring: the fused path runs v1
  const Schedule schedule = build_schedule(routing, c.shape.num_experts, 128);
  return std::all_of(schedule.ranks.begin(), schedule.ranks.end(),
                     [&](const RankSchedule& r) { return r.padded_rows() <= ring_rows; });
}

std::vector<float> widen(const std::vector<uint16_t>& bits) {
  std::vector<float> out(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) out[i] = bf16_to_float(bits[i]);
  return out;
}

}  // namespace

MoELayerOptions layer_options(Path path) {
  MoELayerOptions o;
  o.fused_forward = path == Path::fused;
  return o;
}

size_t heap_bytes(const LayerConfig& c, const std::vector<Path>& paths) {
  size_t bytes = 0;
  for (const Path p : paths) bytes += MoELayer::heap_bytes(c, layer_options(p));
  return bytes;
}

struct RankRunner::Inputs {
  bench_tool::ExpertWeights weights;  // its gradient buffers go unused: each path has its own
  comm::DeviceMemory<bf16> x, dy;
  comm::DeviceMemory<int32_t> idx;
  comm::DeviceMemory<float> scores;
};

struct RankRunner::PathRank {
  comm::DeviceMemory<bf16> y, dx;
  comm::DeviceMemory<float> d_scores;
  bench_tool::WeightGradients gradients;  // both precisions (the steps alternate)
  explicit PathRank(const LayerConfig& c)
      : gradients(bench_tool::make_weight_gradients(c, bench_tool::GradientBuffers::both)) {
    const size_t T = size_t(c.tokens_per_rank), k = size_t(c.shape.top_k), D = size_t(c.shape.hidden);
    y = comm::device_alloc<bf16>(T * D, "cudaMalloc(y)");
    dx = comm::device_alloc<bf16>(T * D, "cudaMalloc(dx)");
    d_scores = comm::device_alloc<float>(T * k, "cudaMalloc(d_topk_scores)");
  }
};

struct RankRunner::PathRun {
  Path path;
  std::unique_ptr<MoELayer> layer;
  std::vector<PathRank> ranks;                      // [local ranks]
  std::unique_ptr<bench::CapturedGraph> graphs[2];  // by gradient type: fp32, bf16
};

RankRunner::RankRunner(comm::World& world, const LayerConfig& c, const SoakOptions& a, ReferenceGather* gather)
    : world_(world), c_(c), a_(a), gather_(gather) {
  check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  const size_t T = size_t(c.tokens_per_rank), k = size_t(c.shape.top_k), D = size_t(c.shape.hidden);
  for (const Path p : a.paths()) {
    PathRun run{p, std::make_unique<MoELayer>(c, world, layer_options(p)), {}, {}};
    for (int l = 0; l < world.local_ranks(); ++l) run.ranks.emplace_back(c);
    paths_.push_back(std::move(run));
  }
  for (int l = 0; l < world.local_ranks(); ++l) {
    Inputs in;
    in.weights = bench_tool::make_expert_weights(c, a.seed * 1000003ull + uint64_t(world.first_local_rank() + l) * 64,
                                                 bench_tool::GradientBuffers::bf16, stream_);
    in.x = comm::device_alloc<bf16>(T * D, "x");
    in.dy = comm::device_alloc<bf16>(T * D, "dy");
    in.idx = comm::device_alloc<int32_t>(T * k, "topk_idx");
    in.scores = comm::device_alloc<float>(T * k, "topk_scores");
    inputs_.push_back(std::move(in));
  }
  const size_t slots = paths_.size() * inputs_.size() * kMaxOutputs;
  sums_ = comm::device_alloc<BufferSums>(slots, "checksums");
  comparisons_ = comm::device_alloc<BufferComparison>(inputs_.size() * kMaxOutputs, "comparisons");
  check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize(setup)");
  if (gather_ != nullptr) {
    const size_t L = size_t(c.local_experts()), I = size_t(c.shape.intermediate),
                 Is = size_t(c.shape.shared_intermediate);
    for (int l = 0; l < world.local_ranks(); ++l) {
      const bench_tool::ExpertWeights& w = inputs_[size_t(l)].weights;
      RankWeights rw;
      rw.w_gate_up = download(reinterpret_cast<const uint16_t*>(w.w_gate_up.get()), L * 2 * I * D);
      rw.w_down = download(reinterpret_cast<const uint16_t*>(w.w_down.get()), L * D * I);
      if (c.shape.num_shared_experts > 0) {
        rw.shared_w_gate_up = download(reinterpret_cast<const uint16_t*>(w.shared_w_gate_up.get()), 2 * Is * D);
        rw.shared_w_down = download(reinterpret_cast<const uint16_t*>(w.shared_w_down.get()), D * Is);
      }
      gather_->add_weights(world.first_local_rank() + l, std::move(rw));
    }
  }
}

RankRunner::~RankRunner() {
  for (PathRun& p : paths_) {
    for (auto& g : p.graphs) g.reset();
  }
  (void)cudaStreamDestroy(stream_);
}

template <typename T>
std::vector<T> RankRunner::download(const T* device, size_t count) const {
  std::vector<T> out(count);
  check_cuda(cudaMemcpyAsync(out.data(), device, count * sizeof(T), cudaMemcpyDeviceToHost, stream_),
             "cudaMemcpyAsync(caracal-soak download)");
  check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize(caracal-soak download)");
  return out;
}

void RankRunner::enqueue_inputs(int64_t s, const Routing& routing) {
  const size_t T = size_t(c_.tokens_per_rank), k = size_t(c_.shape.top_k), D = size_t(c_.shape.hidden);
  for (int l = 0; l < world_.local_ranks(); ++l) {
    Inputs& in = inputs_[size_t(l)];
    const int rank = world_.first_local_rank() + l;
    const uint64_t seed = a_.seed * 104729ull + uint64_t(s) * 257 + uint64_t(rank) * 16;
    bench::fill_uniform(in.x.get(), T * D, seed + 1, -1.0f, 1.0f, stream_);
    bench::fill_uniform(in.dy.get(), T * D, seed + 2, -1.0f, 1.0f, stream_);
    bench::fill_uniform(in.scores.get(), T * k, seed + 3, 0.05f, 1.0f, stream_);
    check_cuda(cudaMemcpyAsync(in.idx.get(), routing.rank_topk(rank), T * k * sizeof(int32_t), cudaMemcpyHostToDevice,
                               stream_),
               "cudaMemcpyAsync(topk_idx)");
  }
}

bool RankRunner::enqueue_pass(PathRun& p, int64_t s) {
  const bool bf16_grads = bf16_gradients(s);
  std::vector<MoEForwardArgs> fwd;
  std::vector<MoEBackwardArgs> bwd;
  for (size_t l = 0; l < inputs_.size(); ++l) {
    const Inputs& in = inputs_[l];
    const PathRank& out = p.ranks[l];
    MoEForwardArgs f;
    f.x = in.x.get();
    f.topk_idx = in.idx.get();
    f.topk_scores = in.scores.get();
    f.weights = in.weights.weights();
    f.y = out.y.get();
    fwd.push_back(f);
    MoEBackwardArgs g;
    g.dy = in.dy.get();
    g.dx = out.dx.get();
    g.d_topk_scores = out.d_scores.get();
    out.gradients.set(g, bf16_grads);
    bwd.push_back(g);
  }
  const auto pass = [&](cudaStream_t stream) {
    const MoEContext context = p.layer->forward(fwd, stream);
    p.layer->backward(bwd, context, stream);
  };
  // Steps 0 and 1 run eagerly (one per gradient type: every kernel's module is loaded before a
  // capture), the graphs are captured at their first use after that.
  if (!a_.graph || s < 2) {
    pass(stream_);
    return false;
  }
  std::unique_ptr<bench::CapturedGraph>& graph = p.graphs[bf16_grads ? 1 : 0];
  if (!graph) graph = std::make_unique<bench::CapturedGraph>(stream_, pass);
  graph->launch(stream_);
  return true;
}

std::vector<OutputBuffer> RankRunner::outputs(const PathRank& r, bool bf16_grads) const {
  const size_t T = size_t(c_.tokens_per_rank), k = size_t(c_.shape.top_k), D = size_t(c_.shape.hidden);
  const size_t L = size_t(c_.local_experts()), I = size_t(c_.shape.intermediate),
               Is = size_t(c_.shape.shared_intermediate);
  const size_t eb = bf16_grads ? 2 : 4;
  const bench_tool::WeightGradients& g = r.gradients;
  const auto pick = [&](const comm::DeviceMemory<float>& fp32, const comm::DeviceMemory<bf16>& b) {
    return bf16_grads ? static_cast<const void*>(b.get()) : static_cast<const void*>(fp32.get());
  };
  std::vector<OutputBuffer> o;
  o.push_back({"y", r.y.get(), T * D * 2, true});
  o.push_back({"dx", r.dx.get(), T * D * 2, true});
  o.push_back({"d_scores", r.d_scores.get(), T * k * 4, false});
  o.push_back({"d_w_gate_up", pick(g.w_gate_up, g.w_gate_up_bf16), L * 2 * I * D * eb, bf16_grads});
  o.push_back({"d_w_down", pick(g.w_down, g.w_down_bf16), L * D * I * eb, bf16_grads});
  if (c_.shape.num_shared_experts > 0) {
    o.push_back({"d_shared_w_gate_up", pick(g.shared_w_gate_up, g.shared_w_gate_up_bf16), 2 * Is * D * eb, bf16_grads});
    o.push_back({"d_shared_w_down", pick(g.shared_w_down, g.shared_w_down_bf16), D * Is * eb, bf16_grads});
  }
  return o;
}

RankStep RankRunner::snapshot(int local, const CheckPlan& plan, bool bf16_grads) const {
  const size_t T = size_t(c_.tokens_per_rank), k = size_t(c_.shape.top_k), D = size_t(c_.shape.hidden);
  const size_t L = size_t(c_.local_experts()), I = size_t(c_.shape.intermediate),
               Is = size_t(c_.shape.shared_intermediate);
  const int rank = world_.first_local_rank() + local;
  const Inputs& in = inputs_[size_t(local)];
  RankStep r;
  r.x = download(reinterpret_cast<const uint16_t*>(in.x.get()), T * D);
  r.dy = download(reinterpret_cast<const uint16_t*>(in.dy.get()), T * D);
  r.topk_scores = download(in.scores.get(), T * k);
  // `count` values from `offset` of a gradient of the step's type, as floats.
  const auto gradient = [&](const comm::DeviceMemory<float>& fp32, const comm::DeviceMemory<bf16>& b, size_t offset,
                            size_t count) {
    if (!bf16_grads) return download(fp32.get() + offset, count);
    return widen(download(reinterpret_cast<const uint16_t*>(b.get()) + offset, count));
  };
  for (const PathRun& p : paths_) {
    const PathRank& o = p.ranks[size_t(local)];
    PathOutputs po;
    po.y = download(reinterpret_cast<const uint16_t*>(o.y.get()), T * D);
    po.dx = download(reinterpret_cast<const uint16_t*>(o.dx.get()), T * D);
    po.d_topk_scores = download(o.d_scores.get(), T * k);
    const bench_tool::WeightGradients& g = o.gradients;
    if (plan.expert >= 0 && plan.expert / int64_t(L) == rank) {
      const size_t e = size_t(plan.expert) % L;
      po.expert_gate_up = gradient(g.w_gate_up, g.w_gate_up_bf16, e * 2 * I * D, 2 * I * D);
      po.expert_down = gradient(g.w_down, g.w_down_bf16, e * D * I, D * I);
    }
    if (plan.shared_rank == rank) {
      po.shared_gate_up = gradient(g.shared_w_gate_up, g.shared_w_gate_up_bf16, 0, 2 * Is * D);
      po.shared_down = gradient(g.shared_w_down, g.shared_w_down_bf16, 0, D * Is);
    }
    r.paths.push_back(std::move(po));
  }
  return r;
}

StepResult RankRunner::step(int64_t s, const Routing& routing, bool reference) {
  const bool bf16_grads = bf16_gradients(s);
  StepResult result;
  enqueue_inputs(s, routing);
  for (PathRun& p : paths_) result.graph_replayed = enqueue_pass(p, s);

  const size_t ranks = inputs_.size(), slots = paths_.size() * ranks * kMaxOutputs;
  check_cuda(cudaMemsetAsync(sums_.get(), 0, slots * sizeof(BufferSums), stream_), "cudaMemsetAsync(sums)");
  check_cuda(cudaMemsetAsync(comparisons_.get(), 0, ranks * kMaxOutputs * sizeof(BufferComparison), stream_),
             "cudaMemsetAsync(comparisons)");
  std::vector<std::vector<std::vector<OutputBuffer>>> buffers(paths_.size());  // [path][rank][output]
  for (size_t p = 0; p < paths_.size(); ++p) {
    for (size_t l = 0; l < ranks; ++l) {
      buffers[p].push_back(outputs(paths_[p].ranks[l], bf16_grads));
      for (size_t o = 0; o < buffers[p][l].size(); ++o) {
        enqueue_sums(buffers[p][l][o], sums_.get() + (p * ranks + l) * kMaxOutputs + o, stream_);
      }
    }
  }
  const bool compare = paths_.size() == 2;  // v1 (paths_[1]) against fused (paths_[0])
  if (compare) {
    for (size_t l = 0; l < ranks; ++l) {
      for (size_t o = 0; o < buffers[0][l].size(); ++o) {
        enqueue_comparison(buffers[1][l][o], buffers[0][l][o], comparisons_.get() + l * kMaxOutputs + o, stream_);
      }
    }
  }
  std::vector<BufferSums> sums(slots);
  std::vector<BufferComparison> comparisons(ranks * kMaxOutputs);
  check_cuda(cudaMemcpyAsync(sums.data(), sums_.get(), slots * sizeof(BufferSums), cudaMemcpyDeviceToHost, stream_),
             "cudaMemcpyAsync(sums)");
  check_cuda(cudaMemcpyAsync(comparisons.data(), comparisons_.get(), comparisons.size() * sizeof(BufferComparison),
                             cudaMemcpyDeviceToHost, stream_),
             "cudaMemcpyAsync(comparisons)");
  check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize(step)");
  for (PathRun& p : paths_) p.layer->check();

  for (size_t l = 0; l < ranks; ++l) {
    const int rank = world_.first_local_rank() + int(l);
    for (size_t p = 0; p < paths_.size(); ++p) {
      std::string line = std::to_string(s) + " " + kind_of(s) + " rank " + std::to_string(rank) +
                         (bf16_grads ? " bf16" : " fp32") + (p > 0 ? std::string(" ") + name_of(paths_[p].path) : "");
      for (size_t o = 0; o < buffers[p][l].size(); ++o) {
        const BufferSums& sum = sums[(p * ranks + l) * kMaxOutputs + o];
        char hex[24];
        std::snprintf(hex, sizeof hex, " %016llx", sum.checksum);
        line += std::string(" ") + buffers[p][l][o].name + hex;
        result.nonfinite += sum.nonfinite;
      }
      result.lines.push_back({{rank, int(p)}, line});
    }
  }

  if (compare) {
    const PathRun& fused = paths_[0];
    const bool y_bitwise = ring_holds_step(c_, routing, fused.layer->ring_rows());
    const bool dx_bitwise = !fused.layer->groups_dx_rows();
    for (size_t l = 0; l < ranks; ++l) {
      const int rank = world_.first_local_rank() + int(l);
      for (size_t o = 0; o < buffers[0][l].size(); ++o) {
        const std::string name = buffers[0][l][o].name;
        const BufferComparison& cmp = comparisons[l * kMaxOutputs + o];
        const std::string where = step_name(s) + ": rank " + std::to_string(rank) + " " + name + ", v1 against fused: ";
        const bool bitwise = (name != "y" || y_bitwise) && (name != "dx" || dx_bitwise);
        if (bitwise) {
          if (cmp.differing == 0) {
            ++result.bitwise_equal[name];
          } else {
            result.failures.push_back(where + std::to_string(cmp.differing) + " of " +
                                      std::to_string(buffers[0][l][o].elements()) +
                                      " elements differ (the layer documents the same bits)");
          }
          continue;
        }
        const double error = cmp.ref2 == 0.0 ? (cmp.err2 == 0.0 ? 0.0 : INFINITY) : std::sqrt(cmp.err2 / cmp.ref2);
        // Each path within its bound of a reference that rounds where it does; the two references
        // apart by one bf16 rounding of the rows one path groups and the other does not.
        const double bound =
            2.0 * (name == "y" ? kReferenceBounds.y : kReferenceBounds.dx) + kReferenceBounds.bf16_rounding;
        result.path_errors[name].add(error, bound);
        if (!(error <= bound)) {
          result.failures.push_back(where + "relative error " + sci(error) + " > bound " + sci(bound) + " (" +
                                    (name == "y" ? "the ring cut the step into macrobatches" : "grouped dx rows") +
                                    ")");
        }
      }
    }
  }

  if (reference && gather_ != nullptr) {
    const CheckPlan plan = plan_check(c_, routing, s);
    for (size_t l = 0; l < ranks; ++l) {
      std::optional<std::vector<RankStep>> all =
          gather_->add_step(s, world_.first_local_rank() + int(l), snapshot(int(l), plan, bf16_grads));
      if (!all) continue;
      std::vector<PathLayout> layouts;
      for (const PathRun& p : paths_)
        layouts.push_back({name_of(p.path), p.layer->ring_rows(), p.layer->groups_dx_rows()});
      const int threads = int(std::max(1u, std::thread::hardware_concurrency()));
      result.reference = gather_->model().check(routing, plan, layouts, *all, bf16_grads, threads);
      for (const OutputCheck& check : result.reference) {
        if (check.passed()) continue;
        result.failures.push_back(step_name(s) + ": " + check.path + " path " + check.output +
                                  " against the fp64 reference: relative error " + sci(check.error) + " > bound " +
                                  sci(check.bound) + " (" + check.sample + ")");
      }
    }
  }
  return result;
}

StallOutcome RankRunner::stall(int64_t s, const Routing& routing) {
  StallOutcome out;
  out.step = s;
  const std::chrono::nanoseconds timeout = world_.wait_timeout();
  const int stalled = world_.world_size() - 1;
  world_.set_wait_timeout(kStallTimeout, stream_);
  world_.stall_next_barrier(stalled, kStallDelay, stream_);
  enqueue_inputs(s, routing);
  PathRun& p = paths_[0];
  const auto start = std::chrono::steady_clock::now();
  try {
    enqueue_pass(p, s);
  } catch (const Error& e) {
    out.failures.push_back(step_name(s) + ", stalled: enqueuing the step raised: " + e.what());
  }
  const size_t ranks = inputs_.size();
  std::vector<std::vector<OutputBuffer>> buffers;
  check_cuda(cudaMemsetAsync(sums_.get(), 0, ranks * kMaxOutputs * sizeof(BufferSums), stream_),
             "cudaMemsetAsync(sums)");
  for (size_t l = 0; l < ranks; ++l) {
    buffers.push_back(outputs(p.ranks[l], bf16_gradients(s)));
    for (size_t o = 0; o < buffers[l].size(); ++o)
      enqueue_sums(buffers[l][o], sums_.get() + l * kMaxOutputs + o, stream_);
  }
  std::vector<BufferSums> sums(ranks * kMaxOutputs);
  check_cuda(
      cudaMemcpyAsync(sums.data(), sums_.get(), sums.size() * sizeof(BufferSums), cudaMemcpyDeviceToHost, stream_),
      "cudaMemcpyAsync(sums)");
  check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize(stalled step)");
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  try {
    p.layer->check();
  } catch (const Error& e) {
    out.message = e.what();
  }
  const auto flags = [&] {
    std::vector<float> f;
    for (int l = 0; l < world_.local_ranks(); ++l) f.push_back(download(world_.fault_flag(l), 1)[0]);
    return f;
  };
  out.fault_flags = flags();
  for (size_t l = 0; l < ranks; ++l) {
    for (size_t o = 0; o < buffers[l].size(); ++o) {
      ++out.outputs;
      out.poisoned_outputs += sums[l * kMaxOutputs + o].nonfinite == buffers[l][o].elements() ? 1 : 0;
    }
  }
  for (PathRun& run : paths_) run.layer->reset(stream_);
  world_.set_wait_timeout(timeout, stream_);
  out.fault_flags_after_reset = flags();

  const std::string where = step_name(s) + ", rank " + std::to_string(stalled) + " stalled " +
                            std::to_string(kStallDelay.count()) + " s past a " + std::to_string(kStallTimeout.count()) +
                            " ms timeout: ";
  const std::string late = "waited for rank " + std::to_string(stalled);
  if (out.message.empty()) {
    out.failures.push_back(where + "check() raised nothing");
  } else if (out.message.find(late) == std::string::npos) {
    out.failures.push_back(where + "check() raised without \"" + late + "\": " + out.message);
  }
  if (std::any_of(out.fault_flags.begin(), out.fault_flags.end(), [](float f) { return f != 1.0f; })) {
    out.failures.push_back(where + "a fault flag did not read 1.0");
  }
  if (out.poisoned_outputs != out.outputs) {
    out.failures.push_back(where + std::to_string(out.outputs - out.poisoned_outputs) + " of " +
                           std::to_string(out.outputs) + " outputs not all NaN");
  }
  if (std::any_of(out.fault_flags_after_reset.begin(), out.fault_flags_after_reset.end(),
                  [](float f) { return f != 0.0f; })) {
    out.failures.push_back(where + "a fault flag did not read 0.0 after reset()");
  }
  if (out.seconds > 10.0) {
    out.failures.push_back(where + "the step took " + sci(out.seconds) +
                           " s: the abort did not end the stalled rank's wait");
  }
  return out;
}

}  // namespace caracal::soak
