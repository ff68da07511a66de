#include "caracal/routing.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <limits>
#include <locale>
#include <numeric>
#include <random>
#include <sstream>

#include "caracal/error.hpp"

namespace caracal {

namespace {

constexpr int64_t kMaxRoutes = std::numeric_limits<int32_t>::max();  // routes use 32-bit indices

// ---- Random numbers ------------------------------------------------------------------------
// Only std::mt19937_64 itself is specified bit-exactly by the standard; the distributions below
// are ours so that a (spec, seed) pair gives the same trace with every standard library.
using Rng = std::mt19937_64;

// Independent streams for independent decisions (popularity order, expert picks, empty slots):
// changing one knob, e.g. the empty-slot fraction, leaves the other draws unchanged.
enum class Stream : uint64_t { kPopularity = 1, kExperts = 2, kEmptySlots = 3 };

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

Rng make_rng(uint64_t seed, Stream stream) {
  return Rng(splitmix64(seed ^ splitmix64(static_cast<uint64_t>(stream))));
}

// Uniform in [0, n), unbiased (Lemire's multiply-shift with rejection), for 1 <= n < 2^32.
uint32_t uniform_below(Rng& rng, uint32_t n) {
  uint64_t product = (rng() >> 32) * n;
  if (static_cast<uint32_t>(product) < n) {
    const uint32_t threshold = static_cast<uint32_t>(-n) % n;
    while (static_cast<uint32_t>(product) < threshold) product = (rng() >> 32) * n;
  }
  return static_cast<uint32_t>(product >> 32);
}

// Uniform in [0, 1) with 53 random bits.
double uniform01(Rng& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

// ---- Argument checks -----------------------------------------------------------------------
int64_t checked_route_count(int64_t world_size, int64_t tokens_per_rank, int64_t top_k) {
  CARACAL_CHECK(world_size >= 1, "routing: world_size must be at least 1, got ", world_size);
  CARACAL_CHECK(tokens_per_rank >= 1, "routing: tokens_per_rank must be at least 1, got ",
                tokens_per_rank);
  CARACAL_CHECK(top_k >= 1, "routing: top_k must be at least 1, got ", top_k);
  const bool fits = tokens_per_rank <= kMaxRoutes / top_k &&
                    world_size <= kMaxRoutes / (tokens_per_rank * top_k);
  CARACAL_CHECK(fits, "routing: world_size * tokens_per_rank * top_k (", world_size, " * ",
                tokens_per_rank, " * ", top_k, ") must be below 2^31 (32-bit route indices)");
  return world_size * tokens_per_rank * top_k;
}

void check_spec(const RoutingSpec& spec, int64_t top_k, int64_t num_experts) {
  CARACAL_CHECK(num_experts >= 1 && num_experts <= std::numeric_limits<int32_t>::max(),
                "routing: num_experts must be in [1, 2^31), got ", num_experts);
  CARACAL_CHECK(spec.empty_slot_fraction >= 0.0 && spec.empty_slot_fraction <= 1.0,
                "routing: empty_slot_fraction must be in [0, 1], got ", spec.empty_slot_fraction);
  switch (spec.kind) {
    case RoutingKind::kZipf:
      CARACAL_CHECK(std::isfinite(spec.zipf_exponent) && spec.zipf_exponent > 0.0,
                    "routing: zipf exponent must be > 0 and finite, got ", spec.zipf_exponent);
      [[fallthrough]];
    case RoutingKind::kUniform:
      CARACAL_CHECK(top_k <= num_experts, "routing: top_k (", top_k,
                    ") must not exceed num_experts (", num_experts, ") for ", to_string(spec),
                    " routing: each token picks distinct experts");
      break;
    case RoutingKind::kAllToOne:
      CARACAL_CHECK(spec.target_expert >= 0 && spec.target_expert < num_experts,
                    "routing: all-to-one target expert must be in [0, num_experts=", num_experts,
                    "), got ", spec.target_expert);
      break;
  }
}

// ---- Expert pickers: each fills top_k distinct slots of one token ---------------------------

// Partial Fisher-Yates over a persistent permutation of the experts: O(top_k) per token. The
// permutation left by earlier tokens does not bias later ones, since every step draws afresh.
class UniformPicker {
 public:
  explicit UniformPicker(int64_t num_experts) : experts_(static_cast<size_t>(num_experts)) {
    std::iota(experts_.begin(), experts_.end(), 0);
  }
  void pick(Rng& rng, int64_t top_k, int32_t* out) {
    const uint32_t n = static_cast<uint32_t>(experts_.size());
    for (uint32_t i = 0; i < static_cast<uint32_t>(top_k); ++i) {
      std::swap(experts_[i], experts_[i + uniform_below(rng, n - i)]);
      out[i] = experts_[i];
    }
  }

 private:
  std::vector<int32_t> experts_;
};

// Successive sampling without replacement with P(popularity rank i) ~ 1 / (i + 1)^exponent.
// Fast path: an alias table with duplicate rejection (rejecting a duplicate and redrawing is
// exactly a draw from the remaining experts). When the chosen experts hold most of the mass
// (large exponents), rejection stalls, so after a few misses the rest of the token is drawn
// exactly from the remaining experts instead.
class ZipfPicker {
 public:
  ZipfPicker(int64_t num_experts, double exponent, Rng& popularity_rng);
  void pick(Rng& rng, int64_t top_k, int32_t* out);

 private:
  static constexpr int kRejectionBudget = 16;  // misses before switching to the exact draw

  uint32_t draw_alias(Rng& rng) const;
  uint32_t draw_remaining(Rng& rng) const;
  uint32_t draw_remaining_from_table(Rng& rng) const;
  uint32_t draw_remaining_in_log_space(Rng& rng) const;
  uint32_t first_remaining() const;
  void choose(uint32_t rank);

  double exponent_;
  std::vector<int32_t> expert_of_rank_;  // popularity rank -> expert (a seeded permutation)
  std::vector<double> log_rank_;         // log(i + 1)
  std::vector<double> tail_;             // [E + 1] sum_{j >= i} w_j, w_j = (j + 1)^-exponent
  std::vector<double> alias_prob_;
  std::vector<uint32_t> alias_;
  // Per-token state: chosen ranks (sorted) and a membership flag per rank.
  std::vector<uint32_t> chosen_;
  std::vector<uint8_t> taken_;
};

ZipfPicker::ZipfPicker(int64_t num_experts, double exponent, Rng& popularity_rng)
    : exponent_(exponent),
      expert_of_rank_(static_cast<size_t>(num_experts)),
      log_rank_(static_cast<size_t>(num_experts)),
      tail_(static_cast<size_t>(num_experts) + 1, 0.0),
      alias_prob_(static_cast<size_t>(num_experts)),
      alias_(static_cast<size_t>(num_experts)),
      taken_(static_cast<size_t>(num_experts), 0) {
  const size_t n = expert_of_rank_.size();
  std::iota(expert_of_rank_.begin(), expert_of_rank_.end(), 0);
  for (size_t i = n; i > 1; --i) {
    std::swap(expert_of_rank_[i - 1],
              expert_of_rank_[uniform_below(popularity_rng, static_cast<uint32_t>(i))]);
  }
  // Weights relative to the most popular expert (w_0 = 1); far ranks may underflow to 0, which
  // the exact draw handles in log space.
  std::vector<double> weight(n);
  for (size_t i = 0; i < n; ++i) {
    log_rank_[i] = std::log(static_cast<double>(i + 1));
    weight[i] = std::exp(-exponent * log_rank_[i]);
  }
  for (size_t i = n; i > 0; --i) tail_[i - 1] = tail_[i] + weight[i - 1];

  // Vose's alias method over the weights scaled to mean 1.
  std::vector<double> scaled(n);
  std::vector<uint32_t> small, large;
  for (size_t i = 0; i < n; ++i) {
    scaled[i] = weight[i] * static_cast<double>(n) / tail_[0];
    (scaled[i] < 1.0 ? small : large).push_back(static_cast<uint32_t>(i));
  }
  while (!small.empty() && !large.empty()) {
    const uint32_t s = small.back(), l = large.back();
    small.pop_back();
    alias_prob_[s] = scaled[s];
    alias_[s] = l;
    scaled[l] -= 1.0 - scaled[s];
    if (scaled[l] < 1.0) {
      large.pop_back();
      small.push_back(l);
    }
  }
  // Whatever is left is 1 up to rounding.
  for (const auto* rest : {&small, &large}) {
    for (const uint32_t i : *rest) {
      alias_prob_[i] = 1.0;
      alias_[i] = i;
    }
  }
}

uint32_t ZipfPicker::draw_alias(Rng& rng) const {
  const uint32_t i = uniform_below(rng, static_cast<uint32_t>(alias_.size()));
  return uniform01(rng) < alias_prob_[i] ? i : alias_[i];
}

uint32_t ZipfPicker::first_remaining() const {
  uint32_t m = 0;
  for (const uint32_t c : chosen_) {  // sorted
    if (c != m) break;
    ++m;
  }
  return m;
}

// Exact draw from the ranks not chosen yet, proportional to their weights.
uint32_t ZipfPicker::draw_remaining(Rng& rng) const {
  // The table is accurate while the most popular remaining weight is a normal double far above
  // underflow; anything it rounds away is then below 2^-100 of that weight.
  const uint32_t m = first_remaining();
  const double top_weight = tail_[m] - tail_[m + 1];
  return top_weight > 0x1.0p-900 ? draw_remaining_from_table(rng) : draw_remaining_in_log_space(rng);
}

// The remaining ranks are the gaps [a, b) between chosen ranks; a gap's mass is
// tail[a] - tail[b]. Weights decrease with rank, so tail[a] is at most (chosen + 1) times the
// remaining mass and the subtraction keeps full relative precision.
uint32_t ZipfPicker::draw_remaining_from_table(Rng& rng) const {
  const auto gap_end = [&](size_t g) {
    return g < chosen_.size() ? chosen_[g] : static_cast<uint32_t>(alias_.size());
  };
  const auto gap_begin = [&](size_t g) { return g == 0 ? 0u : chosen_[g - 1] + 1; };
  double total = 0.0;
  for (size_t g = 0; g <= chosen_.size(); ++g) total += tail_[gap_begin(g)] - tail_[gap_end(g)];
  double r = uniform01(rng) * total;
  uint32_t last_nonempty = 0;
  for (size_t g = 0; g <= chosen_.size(); ++g) {
    const uint32_t a = gap_begin(g), b = gap_end(g);
    if (a >= b) continue;
    last_nonempty = b - 1;
    const double mass = tail_[a] - tail_[b];
    if (r < mass) {
      // First i in [a, b) whose cumulative mass tail[a] - tail[i + 1] exceeds r.
      const double limit = tail_[a] - r;
      const auto it = std::upper_bound(tail_.begin() + a + 1, tail_.begin() + b + 1, limit,
                                       [](double x, double t) { return x > t; });
      return static_cast<uint32_t>(std::min<std::ptrdiff_t>(it - tail_.begin(), b) - 1);
    }
    r -= mass;
  }
  return last_nonempty;  // r landed past the end through rounding
}

// For exponents so large that the remaining weights underflow in the table: weights relative
// to the most popular remaining rank m, (m + 1)^s / (i + 1)^s, scanned in rank order until the
// rest is below 2^-64 of the mass so far (weights decrease, so the rest is bounded by count *
// current weight).
uint32_t ZipfPicker::draw_remaining_in_log_space(Rng& rng) const {
  const uint32_t n = static_cast<uint32_t>(alias_.size());
  const uint32_t m = first_remaining();
  std::vector<std::pair<uint32_t, double>> cumulative;  // (rank, mass up to and including it)
  double total = 0.0;
  for (uint32_t i = m; i < n; ++i) {
    if (taken_[i]) continue;
    const double w = std::exp(exponent_ * (log_rank_[m] - log_rank_[i]));
    if (w * static_cast<double>(n - i) < total * 0x1.0p-64) break;
    total += w;
    cumulative.emplace_back(i, total);
  }
  const double r = uniform01(rng) * total;
  for (const auto& [rank, mass] : cumulative) {
    if (r < mass) return rank;
  }
  return cumulative.back().first;
}

void ZipfPicker::choose(uint32_t rank) {
  taken_[rank] = 1;
  chosen_.insert(std::upper_bound(chosen_.begin(), chosen_.end(), rank), rank);
}

void ZipfPicker::pick(Rng& rng, int64_t top_k, int32_t* out) {
  bool exact = false;
  for (int64_t slot = 0; slot < top_k; ++slot) {
    uint32_t rank = 0;
    int misses = 0;
    while (!exact) {
      rank = draw_alias(rng);
      if (!taken_[rank]) break;
      exact = ++misses == kRejectionBudget;
    }
    if (exact) rank = draw_remaining(rng);
    choose(rank);
    out[slot] = expert_of_rank_[rank];
  }
  for (const uint32_t c : chosen_) taken_[c] = 0;
  chosen_.clear();
}

// Fills every token of every rank with `pick(rng, top_k, token_slots)`.
template <typename Picker>
void fill_tokens(Routing& routing, Rng& rng, Picker& picker) {
  const int64_t tokens = routing.world_size * routing.tokens_per_rank;
  for (int64_t t = 0; t < tokens; ++t) {
    picker.pick(rng, routing.top_k, routing.topk_idx.data() + t * routing.top_k);
  }
}

// Each slot independently becomes -1 with probability `fraction`.
void blank_slots(Routing& routing, double fraction, uint64_t seed) {
  if (fraction <= 0.0) return;
  Rng rng = make_rng(seed, Stream::kEmptySlots);
  for (int32_t& id : routing.topk_idx) {
    if (uniform01(rng) < fraction) id = -1;
  }
}

// ---- Text form -----------------------------------------------------------------------------
constexpr const char* kAcceptedForms =
    "'uniform', 'zipf', 'zipf:<exponent>', 'all-to-one' or 'all-to-one:<expert>'";

// Shortest decimal text that reads back as the same double.
std::string format_double(double value) {
  for (int precision = 1;; ++precision) {
    std::ostringstream os;
    os.imbue(std::locale::classic());
    os.precision(precision);
    os << value;
    std::istringstream is(os.str());
    is.imbue(std::locale::classic());
    double back = 0.0;
    is >> back;
    if (back == value || precision >= std::numeric_limits<double>::max_digits10) return os.str();
  }
}

// The whole text must be the number: no surrounding spaces (which operator>> would skip).
bool parse_double(const std::string& text, double& value) {
  if (text.empty() || std::isspace(static_cast<unsigned char>(text.front()))) return false;
  std::istringstream is(text);
  is.imbue(std::locale::classic());
  is >> value;
  return !is.fail() && is.peek() == std::char_traits<char>::eof();
}

bool parse_int32(const std::string& text, int32_t& value) {
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  return !text.empty() && ec == std::errc() && ptr == end;
}

}  // namespace

void Routing::validate(int64_t num_experts) const {
  CARACAL_CHECK(num_experts >= 1, "routing: num_experts must be at least 1, got ", num_experts);
  const int64_t routes = checked_route_count(world_size, tokens_per_rank, top_k);
  CARACAL_CHECK(static_cast<int64_t>(topk_idx.size()) == routes, "routing: topk_idx holds ",
                topk_idx.size(), " entries, expected world_size * tokens_per_rank * top_k = ",
                world_size, " * ", tokens_per_rank, " * ", top_k, " = ", routes);
  for (int64_t i = 0; i < routes; ++i) {
    const int32_t id = topk_idx[static_cast<size_t>(i)];
    if (id < -1 || id >= num_experts) {
      const int64_t slot = i % top_k, token = i / top_k % tokens_per_rank;
      const int64_t rank = i / (top_k * tokens_per_rank);
      throw Error(detail::concat("routing: topk_idx[rank ", rank, "][token ", token, "][slot ",
                                 slot, "] = ", id, " is outside [-1, num_experts=", num_experts,
                                 ")"));
    }
  }
}

RoutingSpec parse_routing_spec(const std::string& text, const std::string& what) {
  const size_t colon = text.find(':');
  const std::string name = text.substr(0, colon);
  const bool has_arg = colon != std::string::npos;
  const std::string arg = has_arg ? text.substr(colon + 1) : std::string();
  RoutingSpec spec;
  if (name == "uniform" && !has_arg) {
    spec.kind = RoutingKind::kUniform;
  } else if (name == "zipf") {
    spec.kind = RoutingKind::kZipf;
    if (has_arg) {
      const bool ok = parse_double(arg, spec.zipf_exponent) && std::isfinite(spec.zipf_exponent) &&
                      spec.zipf_exponent > 0.0;
      CARACAL_CHECK(ok, what, ": zipf exponent must be a number > 0 and finite, got '", arg,
                    "' in '", text, "'");
    }
  } else if (name == "all-to-one") {
    spec.kind = RoutingKind::kAllToOne;
    if (has_arg) {
      const bool ok = parse_int32(arg, spec.target_expert) && spec.target_expert >= 0;
      CARACAL_CHECK(ok, what, ": all-to-one expert must be a non-negative integer, got '", arg,
                    "' in '", text, "'");
    }
  } else {
    throw Error(detail::concat(what, ": expected ", kAcceptedForms, ", got '", text, "'"));
  }
  return spec;
}

std::string to_string(const RoutingSpec& spec) {
  switch (spec.kind) {
    case RoutingKind::kZipf:
      return "zipf:" + format_double(spec.zipf_exponent);
    case RoutingKind::kAllToOne:
      return "all-to-one:" + std::to_string(spec.target_expert);
    case RoutingKind::kUniform:
      break;
  }
  return "uniform";
}

Routing make_routing(const RoutingSpec& spec, int64_t world_size, int64_t tokens_per_rank,
                     int64_t top_k, int64_t num_experts) {
  const int64_t routes = checked_route_count(world_size, tokens_per_rank, top_k);
  check_spec(spec, top_k, num_experts);

  Routing routing;
  routing.world_size = world_size;
  routing.tokens_per_rank = tokens_per_rank;
  routing.top_k = top_k;
  routing.topk_idx.resize(static_cast<size_t>(routes));
  Rng rng = make_rng(spec.seed, Stream::kExperts);
  switch (spec.kind) {
    case RoutingKind::kUniform: {
      UniformPicker picker(num_experts);
      fill_tokens(routing, rng, picker);
      break;
    }
    case RoutingKind::kZipf: {
      Rng popularity_rng = make_rng(spec.seed, Stream::kPopularity);
      ZipfPicker picker(num_experts, spec.zipf_exponent, popularity_rng);
      fill_tokens(routing, rng, picker);
      break;
    }
    case RoutingKind::kAllToOne:
      std::fill(routing.topk_idx.begin(), routing.topk_idx.end(), spec.target_expert);
      break;
  }
  blank_slots(routing, spec.empty_slot_fraction, spec.seed);
  return routing;
}

}  // namespace caracal
