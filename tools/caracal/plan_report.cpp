#include "plan_report.hpp"

#include <cstdarg>
#include <cstdio>
#include <ostream>
#include <string>

namespace caracal::cli {

namespace {

std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string format(const char* fmt, ...) {
  char buf[256];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, args);
  va_end(args);
  return buf;
}

std::string mib(int64_t bytes) { return format("%12.1f", static_cast<double>(bytes) / (1 << 20)); }

std::string router_text(const RouterNormalization& r) {
  return format("%s, scale %g", r.normalize ? "normalized" : "raw scores", r.scale);
}

nlohmann::json spread_json(const Spread& s) { return {{"min", s.min}, {"mean", s.mean}, {"max", s.max}}; }

}  // namespace

void print_plan_table(std::ostream& os, const Plan& p, const ModelPreset* preset) {
  const LayerConfig& c = p.config;
  const LayerShape& s = c.shape;
  const PlanOptions& o = p.options;
  const RooflinePlan& rf = p.roofline;
  const MemoryPlan& m = p.memory;

  os << "Caracal plan: " << (preset ? preset->description + " (" + preset->name + ")" : std::string("custom shape"))
     << ", " << to_string(c.precision) << "\n";
  os << format("  layer     D=%lld I=%lld E=%lld k=%lld, shared experts %lld (I=%lld), router %s\n",
               (long long)s.hidden, (long long)s.intermediate, (long long)s.num_experts,
               (long long)s.top_k, (long long)s.num_shared_experts, (long long)s.shared_intermediate,
               router_text(c.router).c_str());
  os << format("  world     EP=%lld (%lld experts per rank), T=%lld tokens per rank, routing %s\n",
               (long long)c.ep_size, (long long)c.local_experts(), (long long)c.tokens_per_rank,
               p.routing_source.c_str());
  os << format("  machine   %lld SMs, tile %lldx%lld, %.0f TFLOP/s, NVLink %.0f GB/s per direction\n\n",
               (long long)o.sm_count, (long long)o.tile_m, (long long)o.tile_n, o.tflops, o.nvlink_gbs);

  os << "Traffic                              min        mean         max\n";
  os << format("  routes received per rank  %10.0f  %10.1f  %10.0f\n", p.routes_per_rank.min,
               p.routes_per_rank.mean, p.routes_per_rank.max);
  os << format("  routes per expert         %10.0f  %10.1f  %10.0f\n", p.routes_per_expert.min,
               p.routes_per_expert.mean, p.routes_per_expert.max);
  os << format("  imbalance (max/mean)      ranks %.3f, experts %.3f; empty experts %lld, empty slots %lld\n",
               p.rank_imbalance, p.expert_imbalance, (long long)p.empty_experts, (long long)p.empty_slots);
  os << format("  schedule rows             %lld on the busiest rank; %lld padding rows over all ranks\n\n",
               (long long)p.padded_rows_max, (long long)p.padding_rows_total);

  os << "Overlap (DESIGN §2)\n";
  os << format("  minibatch                 %lld rows (two waves: 2*%lld*%lld*%lld/min(2I,D) = %lld)\n",
               (long long)p.minibatch_rows, (long long)o.sm_count, (long long)o.tile_m,
               (long long)o.tile_n, (long long)p.overlap_min_rows);
  os << format("  ring                      %lld rows = %lld minibatches\n", (long long)p.ring_rows,
               (long long)(p.ring_rows / p.minibatch_rows));
  os << format("  busiest rank              %lld macrobatch(es), backward replays %lld rows\n\n",
               (long long)p.macrobatches, (long long)p.replayed_rows);

  os << "Memory per rank (MoELayer)          MiB\n";
  os << "  symmetric buffers      " << mib(m.symmetric) << "   (per token and route)\n";
  os << "  ring                   " << mib(m.ring) << "   (x, dy, dx at W > 1, gate/up, activation rows)\n";
  os << "  schedule               " << mib(m.schedule) << "   (for the worst case)\n";
  os << "  shared expert          " << mib(m.saved) << "\n";
  os << "  weight-grad partials   " << mib(m.partials) << "   (bf16 gradients across macrobatches)\n";
  os << "  weights                " << mib(m.weights) << "\n";
  os << "  total                  " << mib(m.total())
     << format("   (heap %.1f + local %.1f + weights)\n", static_cast<double>(m.layer_heap) / (1 << 20),
               static_cast<double>(m.layer_local) / (1 << 20));
  os << "  MoELayer v1            " << mib(m.v1_layer_heap + m.v1_layer_local + m.weights)
     << "   (buffers for every route of every rank on this one)\n";
  if (c.precision == Precision::kFP8) {
    os << "  MoELayer fp8 today     " << mib(m.fp8_layer_heap + m.fp8_layer_local + m.fp8_layer_weights)
       << "   (v1's launches: v1's buffers, x in e4m3 at home and pulled, e4m3 rows, quantized + bf16 weights)\n";
  }
  os << "\n";

  os << "Roofline, busiest rank          forward    backward\n";
  os << format("  TFLOP                      %9.3f   %9.3f\n", rf.forward_flops * 1e-12, rf.backward_flops * 1e-12);
  os << format("  compute ms                 %9.3f   %9.3f\n", rf.forward_compute_ms, rf.backward_compute_ms);
  os << format("  NVLink MB (busier dir.)    %9.1f   %9.1f\n", static_cast<double>(rf.forward_nvlink_bytes) * 1e-6,
               static_cast<double>(rf.backward_nvlink_bytes) * 1e-6);
  os << format("  NVLink ms                  %9.3f   %9.3f\n", rf.forward_nvlink_ms, rf.backward_nvlink_ms);
  os << format("  NVLink MB, today's kernels %9.1f   %9.1f   (a row per (token, rank) both ways%s)\n",
               static_cast<double>(rf.today_forward_nvlink_bytes) * 1e-6,
               static_cast<double>(rf.today_backward_nvlink_bytes) * 1e-6,
               c.precision == Precision::kFP8 ? "; FP8: x in e4m3 forward, dy in e4m3 backward" : "");
  os << format("  NVLink MB, per route (v1)  %9.1f   %9.1f\n", static_cast<double>(rf.v1_forward_nvlink_bytes) * 1e-6,
               static_cast<double>(rf.v1_backward_nvlink_bytes) * 1e-6);
  if (c.precision == Precision::kFP8 && rf.forward_pull_bf16_bytes > 0) {
    os << format("  x rows pulled, MB          %9.1f             (%.3f of bf16 rows: e4m3 and their scales)\n",
                 static_cast<double>(rf.forward_pull_bytes) * 1e-6,
                 static_cast<double>(rf.forward_pull_bytes) / static_cast<double>(rf.forward_pull_bf16_bytes));
  }
  os << format("  bound                      %9s   %9s\n\n", rf.forward_bound(), rf.backward_bound());

  os << "GEMM tiles (M x N x K a k step)\n";
  for (const gemm::LayerGemmTile& g : p.gemm_tiles) {
    os << format("  %-24s  %dx%dx%d", g.gemm, g.tile.m, g.tile.n, g.tile.k);
    os << (*g.rule ? std::string("   (") + g.rule + ")" : std::string()) << "\n";
  }
}

nlohmann::json plan_to_json(const Plan& p, const ModelPreset* preset) {
  const LayerConfig& c = p.config;
  const LayerShape& s = c.shape;
  const PlanOptions& o = p.options;
  const RooflinePlan& rf = p.roofline;
  const MemoryPlan& m = p.memory;
  nlohmann::json j;
  j["model"] = preset ? nlohmann::json(preset->name) : nlohmann::json(nullptr);
  j["layer"] = {{"hidden", s.hidden},
                {"intermediate", s.intermediate},
                {"experts", s.num_experts},
                {"top_k", s.top_k},
                {"shared_experts", s.num_shared_experts},
                {"shared_intermediate", s.shared_intermediate},
                {"precision", to_string(c.precision)},
                {"router", {{"normalize", c.router.normalize}, {"scale", c.router.scale}}}};
  j["world"] = {{"ep", c.ep_size},
                {"local_experts", c.local_experts()},
                {"tokens_per_rank", c.tokens_per_rank},
                {"routing", p.routing_source}};
  j["machine"] = {{"sms", o.sm_count},
                  {"tile_m", o.tile_m},
                  {"tile_n", o.tile_n},
                  {"tflops", o.tflops},
                  {"nvlink_gbs", o.nvlink_gbs}};
  j["traffic"] = {{"routes_per_rank", spread_json(p.routes_per_rank)},
                  {"routes_per_expert", spread_json(p.routes_per_expert)},
                  {"rank_imbalance", p.rank_imbalance},
                  {"expert_imbalance", p.expert_imbalance},
                  {"empty_experts", p.empty_experts},
                  {"empty_slots", p.empty_slots},
                  {"padded_rows_max", p.padded_rows_max},
                  {"padding_rows_total", p.padding_rows_total}};
  j["overlap"] = {{"overlap_min_rows", p.overlap_min_rows},
                  {"minibatch_rows", p.minibatch_rows},
                  {"ring_rows", p.ring_rows},
                  {"macrobatches", p.macrobatches},
                  {"replayed_rows", p.replayed_rows}};
  j["memory_bytes"] = {{"symmetric", m.symmetric},     {"ring", m.ring},
                       {"schedule", m.schedule},       {"saved", m.saved},
                       {"partials", m.partials},
                       {"weights", m.weights},         {"total", m.total()},
                       {"layer_heap", m.layer_heap},
                       {"layer_local", m.layer_local},
                       {"v1_layer_heap", m.v1_layer_heap},
                       {"v1_layer_local", m.v1_layer_local},
                       {"fp8_layer_heap", m.fp8_layer_heap},
                       {"fp8_layer_local", m.fp8_layer_local},
                       {"fp8_layer_weights", m.fp8_layer_weights}};
  j["roofline"] = {{"forward",
                    {{"flops", rf.forward_flops},
                     {"compute_ms", rf.forward_compute_ms},
                     {"nvlink_bytes", rf.forward_nvlink_bytes},
                     {"today_nvlink_bytes", rf.today_forward_nvlink_bytes},
                     {"v1_nvlink_bytes", rf.v1_forward_nvlink_bytes},
                     {"pull_bytes", rf.forward_pull_bytes},
                     {"pull_bf16_bytes", rf.forward_pull_bf16_bytes},
                     {"nvlink_ms", rf.forward_nvlink_ms},
                     {"bound", rf.forward_bound()}}},
                   {"backward",
                    {{"flops", rf.backward_flops},
                     {"compute_ms", rf.backward_compute_ms},
                     {"nvlink_bytes", rf.backward_nvlink_bytes},
                     {"today_nvlink_bytes", rf.today_backward_nvlink_bytes},
                     {"v1_nvlink_bytes", rf.v1_backward_nvlink_bytes},
                     {"nvlink_ms", rf.backward_nvlink_ms},
                     {"bound", rf.backward_bound()}}}};
  nlohmann::json tiles = nlohmann::json::array();
  for (const gemm::LayerGemmTile& g : p.gemm_tiles) {
    tiles.push_back({{"gemm", g.gemm}, {"m", g.tile.m}, {"n", g.tile.n}, {"k", g.tile.k}, {"rule", g.rule}});
  }
  j["gemm_tiles"] = tiles;
  return j;
}

}  // namespace caracal::cli
