#include "transfer_bytes.hpp"

#include <algorithm>

namespace caracal::bench {
namespace {

bool routed(int32_t id, int64_t num_experts) { return id >= 0 && id < num_experts; }

}  // namespace

std::vector<int64_t> schedule_rows_per_rank(const Routing& routing, int64_t num_experts, int64_t tile_m) {
  std::vector<int64_t> per_expert(static_cast<size_t>(num_experts), 0);
  for (const int32_t id : routing.topk_idx) {
    if (routed(id, num_experts)) ++per_expert[static_cast<size_t>(id)];
  }
  const int64_t local = num_experts / routing.world_size;
  std::vector<int64_t> rows(static_cast<size_t>(routing.world_size), 0);
  for (int64_t e = 0; e < num_experts; ++e) {
    rows[static_cast<size_t>(e / local)] += (per_expert[static_cast<size_t>(e)] + tile_m - 1) / tile_m * tile_m;
  }
  return rows;
}

RowTraffic traffic_of(const Routing& routing, const transfer::ExchangeShape& shape,
                      const std::vector<int64_t>& rows_per_rank, bool rows_per_route) {
  RowTraffic t;
  t.rows_per_route = rows_per_route;
  t.single_rank = routing.world_size == 1;
  t.routed = std::count_if(routing.topk_idx.begin(), routing.topk_idx.end(),
                           [&](int32_t id) { return routed(id, shape.num_experts); });
  for (const int64_t rows : rows_per_rank) t.padded_rows += rows;
  t.tokens = routing.world_size * routing.tokens_per_rank;
  t.row_bytes = 2 * shape.hidden;

  const size_t W = static_cast<size_t>(routing.world_size);
  const int64_t local = shape.num_experts / routing.world_size;
  const int64_t routes_per_rank = routing.tokens_per_rank * routing.top_k;
  t.remote_pulled.assign(W, 0);
  t.remote_pulled_tokens.assign(W, 0);
  t.remote_pushed.assign(W, 0);
  t.remote_pushed_tokens.assign(W, 0);
  std::vector<int64_t> last_token(W, -1);  // per expert rank: the last token counted there
  for (size_t home = 0; home < W; ++home) {
    const int32_t* ids = routing.rank_topk(static_cast<int64_t>(home));
    std::fill(last_token.begin(), last_token.end(), -1);
    for (int64_t route = 0; route < routes_per_rank; ++route) {
      if (!routed(ids[route], shape.num_experts)) continue;
      const size_t expert_rank = static_cast<size_t>(ids[route] / local);
      const int64_t token = route / routing.top_k;
      const bool first_of_token = last_token[expert_rank] != token;
      last_token[expert_rank] = token;
      if (first_of_token) ++t.pulled_tokens;
      if (expert_rank == home) continue;
      ++t.remote_pulled[expert_rank];
      if (first_of_token) ++t.remote_pulled_tokens[expert_rank];
      ++t.remote_pushed[home];
      if (first_of_token) ++t.remote_pushed_tokens[home];
    }
  }
  return t;
}

std::vector<double> remote_bytes_per_rank(Pass pass, const RowTraffic& t) {
  const std::vector<int64_t>& rows = is_pull(pass)            ? (t.rows_per_route ? t.remote_pulled : t.remote_pulled_tokens)
                                     : pass == Pass::kCombine ? (t.rows_per_route ? t.remote_pushed : t.remote_pushed_tokens)
                                                              : t.remote_pushed;
  std::vector<double> bytes(rows.size());
  for (size_t r = 0; r < rows.size(); ++r) bytes[r] = static_cast<double>(rows[r]) * static_cast<double>(t.row_bytes);
  return bytes;
}

}  // namespace caracal::bench
