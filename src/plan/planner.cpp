#include "caracal/plan.hpp"

#include <algorithm>
#include <cmath>

#include "caracal/block_fp8.hpp"
#include "caracal/error.hpp"
#include "caracal/row_format.hpp"
#include "caracal/schedule.hpp"
#include "caracal/transfer/exchange_shape.hpp"

namespace caracal {

namespace {

int64_t round_up(int64_t value, int64_t multiple) { return (value + multiple - 1) / multiple * multiple; }
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

template <typename T>
Spread spread_of(const std::vector<T>& values) {
  Spread s;
  if (values.empty()) return s;
  const auto [lo, hi] = std::minmax_element(values.begin(), values.end());
  double sum = 0;
  for (const T v : values) sum += static_cast<double>(v);
  s.min = static_cast<double>(*lo);
  s.max = static_cast<double>(*hi);
  s.mean = sum / static_cast<double>(values.size());
  return s;
}

double ratio(double num, double den) { return den > 0 ? num / den : 0.0; }

// Per-rank route and token-row counts taken from the schedule.
struct RankTraffic {
  int64_t received = 0;         // routes this rank's experts process
  int64_t received_remote = 0;  // ... of which come from other ranks (pulled over NVLink)
  int64_t sent_remote = 0;      // routes of this rank's tokens processed on other ranks
  // Token rows here from other ranks: one per (token, rank) and macrobatch of the ring the token's
  // rows fall in (the pulls read a token once per macrobatch: token_group.cuh).
  int64_t tokens_received_remote = 0;
  int64_t tokens_sent_remote = 0;  // the same counted at the tokens' home ranks
  int64_t padded_rows = 0;
};

std::vector<RankTraffic> rank_traffic(const Schedule& schedule, int64_t ring_rows) {
  const int64_t world = schedule.world_size;
  std::vector<RankTraffic> traffic(static_cast<size_t>(world));
  for (int64_t r = 0; r < world; ++r) {
    const RankSchedule& rs = schedule.ranks[static_cast<size_t>(r)];
    RankTraffic& t = traffic[static_cast<size_t>(r)];
    t.padded_rows = rs.padded_rows();
    const int64_t local_experts = static_cast<int64_t>(rs.expert_count.size());
    for (int64_t e = 0; e < local_experts; ++e) {
      for (int64_t src = 0; src < world; ++src) {
        const int64_t n = rs.source_count[static_cast<size_t>(e * world + src)];
        t.received += n;
        if (src != r) {
          t.received_remote += n;
          traffic[static_cast<size_t>(src)].sent_remote += n;
        }
      }
    }
    // Rows in increasing order walk the macrobatches in increasing order: a token row is counted
    // again when one of its rows falls in a later macrobatch than the last one counted.
    std::vector<int64_t> last_macrobatch(rs.token_rows.size(), -1);
    for (size_t row = 0; row < rs.rows.size(); ++row) {
      const int32_t token_row = rs.row_token[row];
      if (token_row < 0) continue;  // padding
      const TokenRow& token = rs.token_rows[static_cast<size_t>(token_row)];
      const int64_t macrobatch = static_cast<int64_t>(row) / ring_rows;
      if (token.src_rank == r || last_macrobatch[static_cast<size_t>(token_row)] == macrobatch) continue;
      last_macrobatch[static_cast<size_t>(token_row)] = macrobatch;
      ++t.tokens_received_remote;
      ++traffic[static_cast<size_t>(token.src_rank)].tokens_sent_remote;
    }
  }
  return traffic;
}

// MoELayer's buffers per rank (src/transfer/token_exchange.cu lay_out, src/layer/local_buffers.cpp)
// without their 256-byte alignment padding, sorted by what they hold: the fused layer over a ring
// of `ring_rows` rows, and v1's over every row its schedule can have. Rows of x, dy and the
// activation in the layer's row format (caracal/row_format.hpp: the FP8 plan shrinks them), the
// rest bf16 rows and 4-byte scalars.
MemoryPlan plan_memory(const LayerConfig& c, int64_t ring_rows, int64_t tile_m, bool bf16_weight_gradients) {
  const LayerShape& s = c.shape;
  const int64_t T = c.tokens_per_rank, k = s.top_k, D = s.hidden, I = s.intermediate;
  const int64_t L = c.local_experts(), W = c.ep_size, routes = T * k;
  const int64_t Is = s.num_shared_experts * s.shared_intermediate;
  const int64_t capacity = W * routes + L * (tile_m - 1);  // the worst case: every route here
  const int64_t routed_rows = capacity / tile_m * tile_m;
  const int64_t ring = std::min(ring_rows, routed_rows);
  const RowFormat rows_of_layer = row_format(c.precision);
  const int64_t x_row = rows_of_layer.row_bytes(D);  // x and dy
  // expert_x, expert_dy and, at W > 1, expert_dx: where the fused backward sums the dx rows of other
  // ranks' tokens per (token, rank) before one goes home.
  const int64_t ring_heap_row = 2 * x_row + (W > 1 ? D * 2 : 0);
  const int64_t ring_local_row = 2 * I * 2 + rows_of_layer.row_bytes(I);  // gate_up, activation
  // One fp32 router-gradient partial per row and 256-column tile of I.
  const auto dgrad_workspace = [](int64_t r, int64_t i) { return r * ceil_div(i, 256) * 4; };

  MemoryPlan m;
  // x, y, dy, dx and the shared expert's output and dx rows per token; one row per (token, slot)
  // for combine, reused by reverse dispatch; topk_idx, scores, gates, score gradients and dg slots.
  m.symmetric = 2 * T * x_row + 2 * T * D * 2 + (Is > 0 ? 2 * T * D * 2 : 0) + routes * D * 2 + 5 * routes * 4;
  m.ring = ring * (ring_heap_row + ring_local_row);
  // The schedule's rows, offsets, counts, inverse view and workspaces (heap), and the per-row g,
  // dL/dg (heap), router-gradient partials and, in FP8, the fused forward's task table (local: 32
  // bytes a task, every row block's 256-wide up/gate and down tiles and its group sums), all for
  // the worst case.
  const int64_t chunks = ceil_div(routes, transfer::kScheduleChunkRoutes);
  const int64_t schedule_heap = capacity * 8 + (2 * L + 2 + L * W) * 4 + routes * 8 + W * routes * 4 +
                                W * (chunks + ceil_div(chunks, transfer::kScheduleBlockChunks)) * L * 4 +
                                2 * capacity * 4;
  const int64_t fp8_task_table = routed_rows / tile_m * (ceil_div(2 * I, 256) + ceil_div(D, 256) + 1) * 32;
  m.schedule = schedule_heap + dgrad_workspace(routed_rows, I) + (c.precision == Precision::kFP8 ? fp8_task_table : 0);
  // The shared expert's gate_up and activation, gates and dg, and, where T is not a multiple of the
  // tile (its rows padded with zeros), its own x (its dx over it), out and dy.
  const int64_t shared_rows = Is > 0 ? ceil_div(T, tile_m) * tile_m : 0;
  const int64_t shared_copies = shared_rows != T ? 2 * x_row + D * 2 : 0;
  m.saved = shared_rows * (shared_copies + 2 * Is * 2 + rows_of_layer.row_bytes(Is)) + shared_rows * 2 * 4 +
            dgrad_workspace(shared_rows, Is);
  // With more rows than the ring, if bf16 weight gradients may be asked for: two fp32 sums of one
  // expert's weight gradients (carrying them across macrobatches).
  m.partials = bf16_weight_gradients && ring < routed_rows ? 2 * 3 * D * I * 4 : 0;
  m.weights = L * (2 * weight_bytes(I, D, c.precision) + weight_bytes(D, I, c.precision)) +
              (Is > 0 ? 2 * weight_bytes(Is, D, c.precision) + weight_bytes(D, Is, c.precision) : 0);

  m.layer_heap = m.symmetric + ring * ring_heap_row + schedule_heap;
  m.layer_local = m.ring - ring * ring_heap_row + m.schedule - schedule_heap + m.saved + m.partials;
  // v1: expert_x, expert_dy and its forward's expert_out over every row; gate_up and the
  // activation over the routed rows.
  m.v1_layer_heap = m.symmetric + schedule_heap + 3 * capacity * D * 2;
  m.v1_layer_local = routed_rows * ring_local_row + m.schedule - schedule_heap + m.saved;
  if (c.precision == Precision::kFP8) {
    LayerConfig bf16 = c;
    bf16.precision = Precision::kBF16;
    const MemoryPlan b = plan_memory(bf16, ring_rows, tile_m, bf16_weight_gradients);
    const int64_t block = kFp8Block;
    const auto scaled_rows = [&](int64_t cols) { return routed_rows * cols + cols / block * routed_rows * 4; };
    // A weight block's scales: a row of fp8_weight_scale_row(blocks) floats per block of the other
    // dimension (caracal/gemm/grouped_gemm_fp8.hpp: 16 bytes a scale, rows of whole 128-byte boxes).
    const auto scale_row = [](int64_t blocks) { return (4 * blocks + 31) / 32 * 32; };
    const auto quantized = [&](int64_t rows, int64_t cols) {  // a [rows][cols] weight in both orientations
      const int64_t rb = ceil_div(rows, block), cb = ceil_div(cols, block);
      return 2 * rows * cols + (cb * scale_row(rb) + rb * scale_row(cb)) * 4;
    };
    // expert_dx; x and, with FP8 weight gradients (the default), dy in e4m3 at home (over T rounded
    // up to the tile) and on the expert side (TokenExchange::dispatch_fp8, reverse_combine_fp8).
    const int64_t home_rows = ceil_div(T, tile_m) * tile_m;
    const int64_t e4m3_pull = home_rows * (D + D / block * 4) + capacity * (D + D / block * 4);
    m.fp8_layer_heap = b.v1_layer_heap + capacity * D * 2 + 2 * e4m3_pull;
    // The routed experts' e4m3 rows (the activation, dy, d_gate_up), weights and dgrad partials per
    // 128 columns, not 256; the shared expert's likewise (x too: it quantizes its own).
    const auto shared_scaled = [&](int64_t cols) { return shared_rows * cols + cols / block * shared_rows * 4; };
    m.fp8_layer_local = b.v1_layer_local + scaled_rows(I) + scaled_rows(D) + scaled_rows(2 * I) +
                        L * (quantized(2 * I, D) + quantized(D, I)) +
                        routed_rows * (ceil_div(I, block) - ceil_div(I, 256)) * 4;
    m.fp8_layer_local += fp8_task_table;  // the bf16 plan's schedule has none
    if (Is > 0) {
      m.fp8_layer_local += 2 * shared_scaled(D) + shared_scaled(Is) + shared_scaled(2 * Is) + quantized(2 * Is, D) +
                           quantized(D, Is) + shared_rows * (ceil_div(Is, block) - ceil_div(Is, 256)) * 4;
    }
    m.fp8_layer_weights = b.weights;
  }
  return m;
}

// Overlap rule (DESIGN §2): two full waves of BM x BN tiles of the up/gate GEMM (N = 2I).
int64_t overlap_min_rows(const LayerShape& s, int64_t sm_count, int64_t tile_m, int64_t tile_n) {
  const int64_t n_min = std::min(2 * s.intermediate, s.hidden);
  return ceil_div(2 * sm_count * tile_m * tile_n, n_min);
}

// Throws caracal::Error unless the SM count and the tile are within the planner's bounds
// (include/caracal/plan.hpp); `sms` names the SM count in the message.
void check_sms_and_tile(const char* sms, int64_t sm_count, int64_t tile_m, int64_t tile_n) {
  CARACAL_CHECK(sm_count >= 1 && sm_count <= kMaxPlanSms, sms, " must be in [1, ", kMaxPlanSms, "], got ", sm_count);
  CARACAL_CHECK(tile_m >= 1 && tile_m <= kMaxPlanTile && tile_n >= 1 && tile_n <= kMaxPlanTile, "tile must be at most ",
                kMaxPlanTile, "x", kMaxPlanTile, " (each side at least 1, e.g. 128x256), got ", tile_m, "x", tile_n);
}

}  // namespace

int64_t default_ring_rows(const LayerConfig& config, int64_t sm_count, int64_t tile_m, int64_t tile_n) {
  config.validate();
  check_sms_and_tile("default_ring_rows: sm_count", sm_count, tile_m, tile_n);
  const LayerShape& s = config.shape;
  const int64_t minibatch = round_up(overlap_min_rows(s, sm_count, tile_m, tile_n), tile_m);
  const int64_t balanced_rows = config.tokens_per_rank * s.top_k + config.local_experts() * (tile_m - 1);
  return round_up(balanced_rows, minibatch);
}

void PlanOptions::validate() const {
  check_sms_and_tile("sms", sm_count, tile_m, tile_n);
  CARACAL_CHECK(std::isfinite(tflops) && tflops > 0, "tflops must be positive, got ", tflops);
  CARACAL_CHECK(std::isfinite(nvlink_gbs) && nvlink_gbs > 0, "nvlink GB/s must be positive, got ",
                nvlink_gbs);
  CARACAL_CHECK(ring_rows >= 0 && ring_rows <= kMaxPlanRingRows, "ring_rows must be in [0, ", kMaxPlanRingRows,
                "] (0: automatic), got ", ring_rows);
}

Plan make_plan(const LayerConfig& config, const Routing& routing, const std::string& routing_source,
               const PlanOptions& options) {
  config.validate();
  options.validate();
  const LayerShape& s = config.shape;
  CARACAL_CHECK(routing.world_size == config.ep_size, "routing: world size ", routing.world_size,
                " does not match ep_size ", config.ep_size);
  CARACAL_CHECK(routing.tokens_per_rank == config.tokens_per_rank, "routing: ", routing.tokens_per_rank,
                " tokens per rank do not match tokens_per_rank ", config.tokens_per_rank);
  CARACAL_CHECK(routing.top_k == s.top_k, "routing: top-k ", routing.top_k, " does not match top_k ",
                s.top_k);

  Plan plan;
  plan.config = config;
  plan.options = options;
  plan.routing_source = routing_source;
  plan.gemm_tiles = gemm::layer_gemm_tiles(config.precision, s.hidden);

  const Schedule schedule = build_schedule(routing, s.num_experts, options.tile_m);

  std::vector<int64_t> per_rank, per_expert;
  for (const RankSchedule& rs : schedule.ranks) {
    per_rank.push_back(rs.routes());
    per_expert.insert(per_expert.end(), rs.expert_count.begin(), rs.expert_count.end());
    plan.padded_rows_max = std::max(plan.padded_rows_max, rs.padded_rows());
    plan.padding_rows_total += rs.padded_rows() - rs.routes();
  }
  plan.routes_per_rank = spread_of(per_rank);
  plan.routes_per_expert = spread_of(per_expert);
  plan.rank_imbalance = ratio(plan.routes_per_rank.max, plan.routes_per_rank.mean);
  plan.expert_imbalance = ratio(plan.routes_per_expert.max, plan.routes_per_expert.mean);
  plan.empty_experts = std::count(per_expert.begin(), per_expert.end(), 0);
  plan.empty_slots = std::count(routing.topk_idx.begin(), routing.topk_idx.end(), -1);

  plan.overlap_min_rows = overlap_min_rows(s, options.sm_count, options.tile_m, options.tile_n);
  plan.minibatch_rows = round_up(plan.overlap_min_rows, options.tile_m);
  if (options.ring_rows > 0) {
    CARACAL_CHECK(options.ring_rows % plan.minibatch_rows == 0,
                  "ring_rows must be a multiple of the minibatch (", plan.minibatch_rows,
                  " rows), got ", options.ring_rows);
    plan.ring_rows = options.ring_rows;
  } else {
    plan.ring_rows = default_ring_rows(config, options.sm_count, options.tile_m, options.tile_n);
  }
  const std::vector<RankTraffic> traffic = rank_traffic(schedule, plan.ring_rows);

  const double D = static_cast<double>(s.hidden), I = static_cast<double>(s.intermediate);
  const double Is = static_cast<double>(s.num_shared_experts * s.shared_intermediate);
  const double T = static_cast<double>(config.tokens_per_rank);
  const int64_t x_row = row_format(config.precision).row_bytes(s.hidden);  // x and dy rows
  const int64_t out_row = s.hidden * 2;  // expert outputs and dx rows travel as bf16
  const double flops_per_tflops_ms = options.tflops * 1e9;  // FLOP per ms
  const double bytes_per_ms = options.nvlink_gbs * 1e6;

  RooflinePlan& rf = plan.roofline;
  for (const RankTraffic& t : traffic) {
    const int64_t macrobatches = std::max<int64_t>(1, ceil_div(t.padded_rows, plan.ring_rows));
    const int64_t replayed = t.padded_rows - std::min(t.padded_rows, plan.ring_rows);
    plan.macrobatches = std::max(plan.macrobatches, macrobatches);
    plan.replayed_rows = std::max(plan.replayed_rows, replayed);

    // Compute runs whole tiles, so padded rows count.
    const double rows = static_cast<double>(t.padded_rows);
    const double fwd = 6.0 * rows * D * I + 6.0 * T * D * Is;
    const double bwd = 2.0 * fwd + 4.0 * static_cast<double>(replayed) * D * I;
    rf.forward_flops = std::max(rf.forward_flops, fwd);
    rf.backward_flops = std::max(rf.backward_flops, bwd);

    // Cross-rank bytes in each direction; the busier direction bounds the rank. The fused kernels'
    // design moves one row per (token, rank) and macrobatch: pull x rows in (expert side), push
    // one summed row per token home (home side receives); backward pulls dy rows in, pushes dx rows home, a 4-byte score
    // gradient per route, and re-pulls the remote share of replayed rows.
    const int64_t replay_remote =
        t.received > 0 ? replayed * t.received_remote / std::max<int64_t>(t.padded_rows, 1) : 0;
    const int64_t fwd_in = t.tokens_received_remote * x_row + t.tokens_sent_remote * out_row;
    const int64_t fwd_out = t.tokens_sent_remote * x_row + t.tokens_received_remote * out_row;
    const int64_t bwd_in = t.tokens_received_remote * x_row + t.tokens_sent_remote * out_row + t.sent_remote * 4 +
                           replay_remote * x_row;
    const int64_t bwd_out = t.tokens_sent_remote * x_row + t.tokens_received_remote * out_row + t.received_remote * 4;
    rf.forward_nvlink_bytes = std::max({rf.forward_nvlink_bytes, fwd_in, fwd_out});
    rf.forward_pull_bytes = std::max(rf.forward_pull_bytes, t.tokens_received_remote * x_row);
    rf.forward_pull_bf16_bytes = std::max(rf.forward_pull_bf16_bytes, t.tokens_received_remote * out_row);
    rf.backward_nvlink_bytes = std::max({rf.backward_nvlink_bytes, bwd_in, bwd_out});
    // Today's kernels move what the design does: the pulls (x, dy) read a token once per rank and
    // macrobatch, combine and the fused backward's dx push one sum per (token, rank) and
    // macrobatch (dL/dg a scalar per route).
    const int64_t today_fwd = std::max(fwd_in, fwd_out);
    int64_t today_bwd = std::max(bwd_in, bwd_out);
    if (config.precision == Precision::kFP8) {
      // Today's FP8 layer (v1's launches, no ring): x crosses in e4m3 in the forward (as above);
      // the backward pulls dy in e4m3 per (token, rank) (FP8 weight gradients, the default) and
      // pushes a dx row and dL/dg per route.
      today_bwd = std::max(t.tokens_received_remote * x_row + t.sent_remote * (out_row + 4),
                           t.tokens_sent_remote * x_row + t.received_remote * (out_row + 4));
    }
    rf.today_forward_nvlink_bytes = std::max(rf.today_forward_nvlink_bytes, today_fwd);
    rf.today_backward_nvlink_bytes = std::max(rf.today_backward_nvlink_bytes, today_bwd);
    // MoELayer v1 as it was, one row per route, and replays nothing.
    const int64_t v1_fwd = std::max(t.received_remote * x_row + t.sent_remote * out_row,
                                    t.sent_remote * x_row + t.received_remote * out_row);
    const int64_t v1_bwd = std::max(t.received_remote * x_row + t.sent_remote * (out_row + 4),
                                    t.sent_remote * x_row + t.received_remote * (out_row + 4));
    rf.v1_forward_nvlink_bytes = std::max(rf.v1_forward_nvlink_bytes, v1_fwd);
    rf.v1_backward_nvlink_bytes = std::max(rf.v1_backward_nvlink_bytes, v1_bwd);
  }
  rf.forward_compute_ms = rf.forward_flops / flops_per_tflops_ms;
  rf.backward_compute_ms = rf.backward_flops / flops_per_tflops_ms;
  rf.forward_nvlink_ms = static_cast<double>(rf.forward_nvlink_bytes) / bytes_per_ms;
  rf.backward_nvlink_ms = static_cast<double>(rf.backward_nvlink_bytes) / bytes_per_ms;

  plan.memory = plan_memory(config, plan.ring_rows, options.tile_m, options.bf16_weight_gradients);
  return plan;
}

double default_plan_tflops(Precision precision) { return precision == Precision::kFP8 ? 1135.0 : 806.0; }

}  // namespace caracal
