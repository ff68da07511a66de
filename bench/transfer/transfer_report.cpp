#include "transfer_report.hpp"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>

#include "caracal/error.hpp"

namespace caracal::bench {
namespace {

double gbps(double bytes, double ms) { return bytes / (ms * 1e6); }

double average(const std::vector<double>& values) {
  return std::accumulate(values.begin(), values.end(), 0.0) / static_cast<double>(values.size());
}

double smallest(const std::vector<double>& values) { return *std::min_element(values.begin(), values.end()); }

void print_error(const DirectionResult& r) {
  if (!r.error.empty()) std::printf("  %s: %s\n", r.check_failed ? "CHECK FAILED" : "ERROR", r.error.c_str());
}

void print_table_error(const DirectionResult& r) {
  if (!r.error.empty()) {
    std::printf("%-12s %-9s %2d %-17s %s: %s\n", r.model.c_str(), r.routing.c_str(), r.world, r.direction.c_str(),
                r.check_failed ? "CHECK FAILED" : "ERROR", r.error.c_str());
  }
}

// ---- Loopback: W ranks on one GPU, against a D2D copy ------------------------------------------

void print_loopback_direction(const DirectionResult& r) {
  std::printf("%s %s W=%d %s: heap %.1f GB, routed %lld, padded rows %lld, schedule %.1f us\n", r.model.c_str(),
              r.routing.c_str(), r.world, r.direction.c_str(), r.heap_bytes / 1e9,
              static_cast<long long>(r.traffic.routed), static_cast<long long>(r.traffic.padded_rows), r.schedule_us);
  for (const Line& l : r.lines) {
    std::printf("  %-17s %8.3f ms %9.1f GB/s  (copy %.3f ms, %.1f GB/s; %.3f GB moved)\n", l.pass.c_str(), l.ms,
                gbps(l.bytes, l.ms), l.copy_ms, gbps(l.bytes, l.copy_ms), l.bytes / 1e9);
  }
  print_error(r);
}

void print_loopback_table(const std::vector<DirectionResult>& results) {
  std::printf(
      "GB/s = row payload read+written per pass, all ranks (bench/transfer/transfer_bytes.hpp; pull: (pulled tokens+"
      "padded rows)*2D; combine: (routed+2*pulled tokens+tokens)*2D; reverse dispatch: (3*routed+tokens)*2D; "
      "W = 1, one pass: (routed+tokens)*2D); copy = one D2D cudaMemcpyAsync moving the same bytes; ratio = "
      "copy ms / ms. "
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
    print_table_error(r);
  }
}

nlohmann::json loopback_line_json(const Line& l) {
  nlohmann::json j = {{"pass", l.pass},
                      {"ms", l.ms},
                      {"bytes_moved", l.bytes},
                      {"gb_per_s", gbps(l.bytes, l.ms)},
                      {"copy_ms", l.copy_ms},
                      {"copy_gb_per_s", gbps(l.bytes, l.copy_ms)},
                      {"ratio_to_copy", l.copy_ms / l.ms}};
  if (l.token_exchange_ms > 0.0) j["token_exchange_ms"] = l.token_exchange_ms;
  return j;
}

constexpr const char* kLoopbackBytesCounted =
    "row payload read + written, all ranks, 2*D bytes per row: dispatch and reverse_combine "
    "(routed + padded_rows) rows, combine and reverse_dispatch (3 * routed + tokens) rows; the copy is one "
    "D2D cudaMemcpyAsync of half those bytes (read once, written once); nccl lines use TokenExchange's bytes";

// ---- NCCL: one GPU per rank, NVLink bytes only ----------------------------------------------------

void print_nccl_direction(const DirectionResult& r) {
  std::printf("%s %s W=%d %s: heap %.1f GB per GPU, routed %lld, padded rows %lld, schedule %.1f us (slowest rank)\n",
              r.model.c_str(), r.routing.c_str(), r.world, r.direction.c_str(), r.heap_bytes / r.world / 1e9,
              static_cast<long long>(r.traffic.routed), static_cast<long long>(r.traffic.padded_rows), r.schedule_us);
  for (const Line& l : r.lines) {
    std::printf(
        "  %-17s %8.3f ms  NVLink %.1f GB/s per GPU (min %.1f; %.3f GB into each GPU on average); %.3f GB moved "
        "per GPU\n",
        l.pass.c_str(), l.ms, gbps(average(l.remote_bytes), l.ms), gbps(smallest(l.remote_bytes), l.ms),
        average(l.remote_bytes) / 1e9, l.bytes / r.world / 1e9);
  }
  print_error(r);
}

void print_nccl_table(const std::vector<DirectionResult>& results) {
  std::printf(
      "NVL GB/s = bytes crossing NVLink into a GPU / ms, averaged over the W GPUs; min = the GPU receiving the "
      "fewest. Only NVLink-crossing bytes are counted: routed rows whose home rank is not their expert's rank, "
      "2D bytes each, once, at the GPU they are written into (pull passes: the expert's; push passes: the "
      "home's); padding rows, slot sums and rows staying on their GPU are not. ms = the slowest rank's median. "
      "NVL GB/GPU = those bytes per GPU (average); all GB/GPU = all row payload read+written, all ranks / W "
      "(the loopback count). sched us = one build_schedule launch per rank, slowest rank.\n");
  std::printf("%-12s %-9s %2s %-17s %8s %9s %9s %10s %10s %9s\n", "model", "routing", "W", "pass", "ms", "NVL GB/s",
              "min GB/s", "NVL GB/GPU", "all GB/GPU", "sched us");
  for (const DirectionResult& r : results) {
    for (const Line& l : r.lines) {
      std::printf("%-12s %-9s %2d %-17s %8.3f %9.1f %9.1f %10.3f %10.3f %9.1f\n", r.model.c_str(), r.routing.c_str(),
                  r.world, l.pass.c_str(), l.ms, gbps(average(l.remote_bytes), l.ms),
                  gbps(smallest(l.remote_bytes), l.ms), average(l.remote_bytes) / 1e9, l.bytes / r.world / 1e9,
                  r.schedule_us);
    }
    print_table_error(r);
  }
}

nlohmann::json nccl_line_json(const Line& l, int world) {
  return {{"pass", l.pass},
          {"ms", l.ms},
          {"rank_ms", l.rank_ms},
          {"bytes_moved", l.bytes},
          {"bytes_moved_per_gpu", l.bytes / world},
          {"remote_bytes_per_gpu", l.remote_bytes},
          {"remote_bytes_per_gpu_avg", average(l.remote_bytes)},
          {"remote_gb_per_s_per_gpu_avg", gbps(average(l.remote_bytes), l.ms)},
          {"remote_gb_per_s_per_gpu_min", gbps(smallest(l.remote_bytes), l.ms)}};
}

constexpr const char* kNcclBytesCounted =
    "remote bytes: only rows that cross NVLink (routed rows whose home rank is not their expert's rank, expert e "
    "on rank e / (E / W)), 2*D bytes each, counted once at the GPU they are written into (dispatch and "
    "reverse_combine: the expert's rank, which pulls them; combine and reverse_dispatch: the home rank, into "
    "which they are pushed); GB/s per GPU = those bytes / ms, ms = the slowest rank's median (rank_ms: each "
    "rank's). bytes_moved: row payload read + written, all ranks, as in the loopback backend";

}  // namespace

void print_header(const cudaDeviceProp& prop, const Options& o, uint64_t seed) {
  if (!o.nccl()) {
    std::printf(
        "caracal_transfer_bench: %s, %d SMs; T=%lld tokens/rank, tile_m %lld, median of %d runs after %d "
        "warm-up, seed %llu (--seed to replay)\n",
        prop.name, prop.multiProcessorCount, static_cast<long long>(o.tokens), static_cast<long long>(kTileM), o.reps,
        o.warmup, static_cast<unsigned long long>(seed));
    return;
  }
  std::printf(
      "caracal_transfer_bench: NCCL backend, one GPU per rank (%s, %d SMs), one host thread per GPU; T=%lld "
      "tokens/rank, tile_m %lld, median of %d runs after at least %d warm-up runs and 200 ms (the same count "
      "on every rank), seed %llu (--seed to replay)\n",
      prop.name, prop.multiProcessorCount, static_cast<long long>(o.tokens), static_cast<long long>(kTileM), o.reps,
      o.warmup, static_cast<unsigned long long>(seed));
}

void print_direction(const DirectionResult& r, const Options& o) {
  if (o.nccl()) {
    print_nccl_direction(r);
  } else {
    print_loopback_direction(r);
  }
}

void print_table(const std::vector<DirectionResult>& results, const cudaDeviceProp& prop, const Options& o,
                 uint64_t seed) {
  std::printf("\n==== caracal_transfer_bench summary: %s%s, T=%lld tokens/rank, median of %d runs, seed %llu\n",
              prop.name, o.nccl() ? " x W over NCCL" : "", static_cast<long long>(o.tokens), o.reps,
              static_cast<unsigned long long>(seed));
  if (o.nccl()) {
    print_nccl_table(results);
  } else {
    print_loopback_table(results);
  }
}

void write_json(const std::string& path, const std::vector<DirectionResult>& results, const cudaDeviceProp& prop,
                const Options& o, uint64_t seed) {
  nlohmann::json cases = nlohmann::json::array();
  for (const DirectionResult& r : results) {
    nlohmann::json lines = nlohmann::json::array();
    for (const Line& l : r.lines) lines.push_back(o.nccl() ? nccl_line_json(l, r.world) : loopback_line_json(l));
    cases.push_back({{"model", r.model},
                     {"routing", r.routing},
                     {"world", r.world},
                     {"direction", r.direction},
                     {"routed_rows", r.traffic.routed},
                     {"pulled_token_rows", r.traffic.pulled_tokens},
                     {"padded_rows", r.traffic.padded_rows},
                     {"tokens", r.traffic.tokens},
                     {"row_bytes", r.traffic.row_bytes},
                     {"heap_bytes", r.heap_bytes},
                     {"schedule_us", r.schedule_us},
                     {"passes", lines},
                     {"error", r.error},
                     {"check_failed", r.check_failed}});
  }
  const nlohmann::json out = {{"backend", o.backend},
                              {"device", prop.name},
                              {"sms", prop.multiProcessorCount},
                              {"tokens_per_rank", o.tokens},
                              {"tile_m", kTileM},
                              {"warmup", o.warmup},
                              {"reps", o.reps},
                              {"rows_per_route", o.rows_per_route},
                              {"seed", seed},
                              {"bytes_counted", o.nccl() ? kNcclBytesCounted : kLoopbackBytesCounted},
                              {"cases", cases}};
  std::ofstream file(path);
  CARACAL_CHECK(file.good(), "cannot write --json ", path);
  file << out.dump(1) << '\n';
}

}  // namespace caracal::bench
