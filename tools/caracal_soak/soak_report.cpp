#include "soak_report.hpp"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "soak_reference.hpp"
#include "soak_steps.hpp"

namespace caracal::soak {
namespace {

bool memory_flat(const Summary& s) {
  return std::all_of(s.memory.begin(), s.memory.end(), [](const auto& m) { return m.first == m.second; });
}

std::string sci(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2e", v);
  return text;
}

std::string largest_list(const std::map<std::string, Largest>& errors) {
  std::string out;
  for (const auto& [name, l] : errors) {
    out += (out.empty() ? "" : ", ") + name + " " + sci(l.error) + " (bound " + sci(l.bound) + ")";
  }
  return out;
}

constexpr size_t kFailuresListed = 10;

}  // namespace

bool passed(const Summary& s) { return s.failures.empty() && s.nonfinite == 0 && memory_flat(s); }

void print_summary(const SoakOptions& a, const LayerConfig& c, const Summary& s, const std::string& digest) {
  std::cout << "caracal-soak: " << a.backend << " W=" << a.ep << ", " << a.steps << " steps (routing " << kKinds[0]
            << ", " << kKinds[1] << ", " << kKinds[2] << ", " << kKinds[3] << ", " << kKinds[4]
            << " in turn; fp32 and bf16 weight gradients in turn), D=" << a.hidden << " I=" << a.intermediate
            << " E=" << c.shape.num_experts << " k=" << a.top_k << " shared I=" << a.shared_intermediate
            << " T=" << a.tokens << "; path " << a.path << (a.graph ? ", CUDA graphs" : ", eager") << "\n";
  std::cout << "  errors: 0 (check() after every step)\n";
  std::cout << "  non-finite output elements: " << s.nonfinite << "\n";
  if (a.reference_every > 0 || a.stalls()) {
    std::cout << "  fp64 reference: " << s.reference_checks << " steps checked ("
              << (a.reference_every > 0 ? "one in every " + std::to_string(a.reference_every) : std::string())
              << (a.reference_every > 0 && a.stalls() ? ", and " : "")
              << (a.stalls() ? "the stalled step run again" : "") << "; " << kSampledTokensPerRank
              << " sampled tokens of each rank, one routed and one shared expert's weight gradients); relative "
                 "errors nearest their bounds: "
              << largest_list(s.reference_errors) << "\n";
  } else {
    std::cout << "  fp64 reference: off (--reference-every 0)\n";
  }
  if (a.path == "both") {
    std::string bitwise;
    for (const auto& [name, n] : s.bitwise_equal)
      bitwise += (bitwise.empty() ? "" : ", ") + name + " " + std::to_string(n);
    std::cout << "  v1 against fused, (step, rank) pairs bitwise equal: " << bitwise;
    if (!s.path_errors.empty()) {
      std::cout << "; elsewhere (ring macrobatches, grouped dx rows) within twice the reference bounds and a bf16 rounding, nearest: "
                << largest_list(s.path_errors);
    }
    std::cout << "\n";
  }
  if (a.graph) std::cout << "  CUDA graphs: " << s.replays << " steps replayed (steps 0 and 1 ran eagerly)\n";
  if (s.stall) {
    const StallOutcome& st = *s.stall;
    std::cout << "  stall at step " << st.step << ": check() "
              << (st.message.empty() ? "raised nothing"
                                     : "raised \"" + st.message.substr(0, st.message.find('\n')) + "\"")
              << "; fault flag";
    for (const float f : st.fault_flags) std::cout << " " << f;
    std::cout << " (after reset():";
    for (const float f : st.fault_flags_after_reset) std::cout << " " << f;
    std::cout << "); " << st.poisoned_outputs << " of " << st.outputs << " outputs all NaN; " << st.seconds
              << " s; then reset() and the step again (reference-checked)"
              << (st.failures.empty() ? "" : ": " + std::to_string(st.failures.size()) + " expectations FAILED")
              << "\n";
  }
  for (size_t g = 0; g < s.memory.size(); ++g) {
    std::cout << "  GPU " << g << " memory in use after step " << std::min<int64_t>(a.steps, 2 * kKindCount) << ": "
              << s.memory[g].first << " bytes, after the last: " << s.memory[g].second << " bytes"
              << (s.memory[g].first == s.memory[g].second ? " (flat)" : " (CHANGED)") << "\n";
  }
  std::cout << "  " << s.seconds << " s, " << double(a.steps) / s.seconds << " steps/s\n";
  if (!s.failures.empty()) {
    std::cout << "  FAILED checks: " << s.failures.size()
              << (s.failures.size() > kFailuresListed ? ", the first:" : ":") << "\n";
    for (size_t i = 0; i < std::min(kFailuresListed, s.failures.size()); ++i)
      std::cout << "    " << s.failures[i] << "\n";
  }
  std::cout << "  digest of every output checksum: " << digest << "\n";
}

void write_json(const SoakOptions& a, const Summary& s, const std::string& digest) {
  if (a.json.empty()) return;
  const auto errors = [](const std::map<std::string, Largest>& m) {
    nlohmann::json j = nlohmann::json::object();
    for (const auto& [name, l] : m) j[name] = {{"largest", l.error}, {"bound", l.bound}};
    return j;
  };
  nlohmann::json j = {{"backend", a.backend},
                      {"ep", a.ep},
                      {"steps", a.steps},
                      {"seed", a.seed},
                      {"path", a.path},
                      {"graph", a.graph},
                      {"nonfinite", s.nonfinite},
                      {"memory_flat", memory_flat(s)},
                      {"seconds", s.seconds},
                      {"digest", digest},
                      {"passed", passed(s)},
                      {"failures", s.failures},
                      {"reference",
                       {{"every", a.reference_every},
                        {"checked_steps", s.reference_checks},
                        {"sampled_tokens_per_rank", kSampledTokensPerRank},
                        {"errors", errors(s.reference_errors)}}}};
  if (a.path == "both") j["v1_vs_fused"] = {{"bitwise_equal", s.bitwise_equal}, {"errors", errors(s.path_errors)}};
  if (a.graph) j["replays"] = s.replays;
  if (s.stall) {
    const StallOutcome& st = *s.stall;
    j["stall"] = {{"step", st.step},
                  {"raised", st.message},
                  {"fault_flags", st.fault_flags},
                  {"fault_flags_after_reset", st.fault_flags_after_reset},
                  {"outputs", st.outputs},
                  {"poisoned_outputs", st.poisoned_outputs},
                  {"seconds", st.seconds},
                  {"passed", st.failures.empty()}};
  }
  std::ofstream(a.json) << j.dump(2) << "\n";
}

}  // namespace caracal::soak
