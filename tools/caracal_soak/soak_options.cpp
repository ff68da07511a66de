#include "soak_options.hpp"

#include "caracal/error.hpp"

namespace caracal::soak {

const char* name_of(Path p) { return p == Path::fused ? "fused" : "v1"; }

std::vector<Path> SoakOptions::paths() const {
  if (path == "v1") return {Path::v1};
  if (path == "both") return {Path::fused, Path::v1};
  return {Path::fused};
}

void add_soak_options(CLI::App& app, SoakOptions& a) {
  app.add_option("--ep", a.ep, "W: expert-parallel degree")->capture_default_str();
  app.add_option("--backend", a.backend, "loopback (W virtual ranks on GPU 0) | nccl (one GPU per rank)")
      ->check(CLI::IsMember({"loopback", "nccl"}))
      ->capture_default_str();
  app.add_option("--steps", a.steps, "forward+backward steps")->capture_default_str();
  app.add_option("--hidden", a.hidden, "D")->capture_default_str();
  app.add_option("--intermediate", a.intermediate, "I")->capture_default_str();
  app.add_option("--experts-per-rank", a.experts_per_rank, "E / W")->capture_default_str();
  app.add_option("--top-k", a.top_k, "k")->capture_default_str();
  app.add_option("--shared-intermediate", a.shared_intermediate, "I of the shared expert (0: none)")
      ->capture_default_str();
  app.add_option("--tokens", a.tokens, "T per rank")->capture_default_str();
  app.add_option("--seed", a.seed, "seed of the routings, inputs and weights")->capture_default_str();
  app.add_option("--checksums", a.checksums, "write one line of checksums per (step, rank) to this file");
  app.add_option("--json", a.json, "write the summary as JSON to this file");
  app.add_option("--reference-every", a.reference_every,
                 "check a step in every N against the fp64 reference (sampled tokens, one routed and one shared "
                 "expert's weight gradients); 0: never")
      ->capture_default_str();
  app.add_flag("--graph", a.graph,
               "capture each path's forward+backward into a CUDA graph (one per weight-gradient type, after an eager "
               "step of each) and replay it every step with the new routing and inputs");
  app.add_option("--path", a.path,
                 "fused (the default layer) | v1 (separate launches) | both (each step on both layers, outputs "
                 "compared)")
      ->check(CLI::IsMember({"fused", "v1", "both"}))
      ->capture_default_str();
  app.add_option("--stall-at", a.stall_at,
                 "loopback, W >= 2, a step from 2: the last rank stalls past a 200 ms wait timeout; the step must "
                 "fail and poison its outputs, then reset() and the step again, exact");
}

void check_soak_options(const SoakOptions& a) {
  CARACAL_CHECK(a.ep >= 1, "--ep must be at least 1, got ", a.ep);
  CARACAL_CHECK(a.steps >= 1, "--steps must be at least 1, got ", a.steps);
  CARACAL_CHECK(a.experts_per_rank >= 1, "--experts-per-rank must be at least 1, got ", a.experts_per_rank);
  CARACAL_CHECK(a.shared_intermediate >= 0, "--shared-intermediate must be 0 (no shared expert) or positive, got ",
                a.shared_intermediate);
  CARACAL_CHECK(a.reference_every >= 0, "--reference-every must be 0 (off) or a step count, got ", a.reference_every);
  CARACAL_CHECK(!a.graph || a.steps >= 3, "--graph needs --steps >= 3 (steps 0 and 1 run eagerly, one per weight-",
                "gradient type, before the graphs are captured), got --steps ", a.steps);
  if (a.stall_at != -1) {  // -1: not given
    CARACAL_CHECK(!a.nccl(),
                  "--stall-at needs --backend loopback (the stall hook delays a rank of this "
                  "process's world), got --backend ",
                  a.backend);
    CARACAL_CHECK(a.ep >= 2,
                  "--stall-at needs --ep >= 2 (one rank stalls, the others time out waiting for it), "
                  "got --ep ",
                  a.ep);
    CARACAL_CHECK(a.stall_at >= 2 && a.stall_at < a.steps, "--stall-at must be a step of the run from 2 (steps 0 ",
                  "and 1 load the kernels, one per gradient type) to ", a.steps - 1, " (--steps ", a.steps, "), got ",
                  a.stall_at);
  }
  soak_config(a).validate();
}

LayerConfig soak_config(const SoakOptions& a) {
  LayerConfig c;
  c.shape.hidden = a.hidden;
  c.shape.intermediate = a.intermediate;
  c.shape.num_experts = a.experts_per_rank * a.ep;
  c.shape.top_k = a.top_k;
  c.shape.num_shared_experts = a.shared_intermediate > 0 ? 1 : 0;
  c.shape.shared_intermediate = a.shared_intermediate;
  c.ep_size = a.ep;
  c.tokens_per_rank = a.tokens;
  return c;
}

}  // namespace caracal::soak
