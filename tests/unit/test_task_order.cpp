// The fused kernels' task orders (src/fused/forward_tasks.cuh, backward_tasks.cuh), walked
// on the host as the producers walk them: every tile once, and the rule that keeps a launch of
// resident CTAs free of deadlock — a task waits only on counters raised by the comm role or by
// tasks earlier in the order (and the comm role's pulls only on tasks earlier than those that read
// what they pull). The waits and raises below are those of produce_forward_tiles /
// consume_forward_tiles / pull_forward_rows / sum_block_groups, and of produce_backward_tiles /
// consume_backward_tiles / pull_backward_rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

// ForwardTaskCursor sets its tile scheduler at its first task (its phase and macrobatch start
// matching none), which GCC's -Wmaybe-uninitialized does not follow once the cursor is inlined.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "fused/backward_tasks.cuh"
#include "fused/forward_tasks.cuh"

namespace caracal::fused {
namespace {

using gemm::kBlockM;

// Each of a compute CTA's 8 consumer warps raises sums_done once per group_sums task
// (forward_group_sums.cuh: kGroupSumWarps); each of a tile's two consumer warpgroups raises its
// block's counters once.
constexpr uint32_t kGroupSumWarps = 8;
constexpr uint32_t kWarpgroups = 2;

// A schedule in host memory: experts' segments of whole 128-row blocks.
struct HostSchedule {
  std::vector<int32_t> offsets;
  ScheduleView view;

  HostSchedule(const std::vector<int>& expert_blocks, int capacity_blocks, int ring_blocks) {
    offsets.push_back(0);
    for (int blocks : expert_blocks) offsets.push_back(offsets.back() + blocks * kBlockM);
    view.expert_offset = offsets.data();
    view.num_experts = static_cast<int>(expert_blocks.size());
    view.row_capacity = capacity_blocks * kBlockM;
    view.ring_rows = ring_blocks * kBlockM;
  }
  HostSchedule(const HostSchedule&) = delete;
};

gemm::RowTileScheduler::Params tiles_of(const ScheduleView& view, int n_blocks) {
  return gemm::RowTileScheduler::Params{view, n_blocks, /*k_tiles=*/4, nullptr};
}

// A readiness counter: its kind and its index (a block, or a macrobatch).
enum class Kind { x_ready, activation_ready, shared_activation_ready, down_done, out_stored, sums_done,
                  dy_ready, dgrad_done, shared_dgrad_done, dx_done };
using Counter = std::pair<Kind, int>;

struct Wait {
  Counter counter;
  uint32_t target;  // the count the producer waits for
};

// What one task waits on before its loads and raises after them.
struct TaskEffects {
  std::vector<Wait> waits;
  std::vector<std::pair<Counter, uint32_t>> raises;
};

// Counters only the comm role raises: no task needs to precede a wait on them.
bool raised_by_comm(Kind kind) { return kind == Kind::x_ready || kind == Kind::dy_ready; }

std::string name(const Counter& c) {
  static const char* const names[] = {"x_ready",    "activation_ready", "shared_activation_ready", "down_done",
                                      "out_stored", "sums_done",        "dy_ready",                "dgrad_done",
                                      "shared_dgrad_done", "dx_done"};
  return std::string(names[static_cast<int>(c.first)]) + "[" + std::to_string(c.second) + "]";
}

// Every breach of the rule by the tasks in `order` (their effects), as text.
std::vector<std::string> rule_breaches(const std::vector<TaskEffects>& order) {
  std::map<Counter, uint32_t> total;     // every task's raises
  std::map<Counter, uint32_t> raised;    // by the tasks before the current one
  for (const TaskEffects& t : order) {
    for (const auto& [counter, count] : t.raises) total[counter] += count;
  }
  std::vector<std::string> breaches;
  for (size_t i = 0; i < order.size(); ++i) {
    for (const Wait& w : order[i].waits) {
      if (raised_by_comm(w.counter.first)) continue;
      if (raised[w.counter] < w.target) {
        std::ostringstream s;
        s << "task " << i << " waits for " << name(w.counter) << " = " << w.target << ", raised to " << raised[w.counter]
          << " by earlier tasks (" << total[w.counter] << " by all)";
        breaches.push_back(s.str());
      }
    }
    for (const auto& [counter, count] : order[i].raises) raised[counter] += count;
  }
  // A wait that more raises than it expects reach would pass early: every counter a task waits on
  // ends where it waits.
  for (const TaskEffects& t : order) {
    for (const Wait& w : t.waits) {
      if (!raised_by_comm(w.counter.first) && total[w.counter] != w.target) {
        breaches.push_back(name(w.counter) + " ends at " + std::to_string(total[w.counter]) + ", waited for at " +
                           std::to_string(w.target));
      }
    }
  }
  return breaches;
}

// ---- The forward -----------------------------------------------------------------------------

struct ForwardShape {
  std::vector<int> expert_blocks;  // the routed experts' row blocks
  int capacity_blocks;
  int ring_blocks;   // 0: no ring (one macrobatch)
  int shared_blocks; // 0: no shared expert
  int up_n_blocks = 3;
  int down_n_blocks = 2;
};

std::ostream& operator<<(std::ostream& os, const ForwardShape& s) {
  os << "experts' blocks {";
  for (int b : s.expert_blocks) os << b << ",";
  return os << "}, capacity " << s.capacity_blocks << ", ring " << s.ring_blocks << ", shared " << s.shared_blocks
            << ", N blocks " << s.up_n_blocks << "/" << s.down_n_blocks;
}

// The tasks in the order the producers take them (produce_forward_tiles: the routed tasks are
// counted once a task past the shared expert's is taken).
std::vector<ForwardTask> forward_order(const ExpertTiles* shared, const ExpertTiles& routed, Macrobatches& batches) {
  ForwardTaskCursor tasks(shared, routed);
  std::vector<ForwardTask> order;
  for (int t = 0;; ++t) {
    if (t >= tasks.shared_tasks() && !tasks.routed_counted()) tasks.count_routed_tasks();
    if (t >= tasks.num_tasks()) break;
    order.push_back(tasks.at(t));
  }
  batches = tasks.macrobatches();
  return order;
}

// What a forward task waits on and raises (produce_forward_tiles, consume_forward_tiles,
// sum_block_groups: a group's members lie in the task's macrobatch, all of whose blocks are counted
// here).
TaskEffects forward_effects(const ForwardTask& task, const ExpertTiles* shared, const ExpertTiles& routed,
                            const Macrobatches& batches) {
  TaskEffects e;
  const int block = task.m_block();
  const int previous = task.shared() ? -1 : batches.previous_in_ring(block);
  const uint32_t down_slices = kWarpgroups * static_cast<uint32_t>(routed.down.n_blocks);
  switch (task.phase) {
    case ForwardPhase::shared_up_gate:
      e.raises.push_back({{Kind::shared_activation_ready, block}, kWarpgroups});
      break;
    case ForwardPhase::shared_down:
      e.waits.push_back({{Kind::shared_activation_ready, block}, kWarpgroups * static_cast<uint32_t>(shared->up.n_blocks)});
      break;
    case ForwardPhase::up_gate:
      if (previous >= 0) e.waits.push_back({{Kind::down_done, previous}, down_slices});
      e.waits.push_back({{Kind::x_ready, block}, 0});
      e.raises.push_back({{Kind::activation_ready, block}, kWarpgroups});
      break;
    case ForwardPhase::down:
      e.waits.push_back({{Kind::activation_ready, block}, kWarpgroups * static_cast<uint32_t>(routed.up.n_blocks)});
      if (previous >= 0) {
        const int batch = batches.of_block(previous);
        e.waits.push_back({{Kind::sums_done, batch}, kGroupSumWarps * static_cast<uint32_t>(batches.blocks_in(batch))});
      }
      e.raises.push_back({{Kind::down_done, block}, kWarpgroups});
      if (Macrobatches::summed_in_launch(routed.up.schedule, block)) {
        e.raises.push_back({{Kind::out_stored, block}, kWarpgroups});
      }
      break;
    case ForwardPhase::group_sums:
      for (int member = task.tile.k_begin / kBlockM; member < task.tile.active_end / kBlockM; ++member) {
        e.waits.push_back({{Kind::out_stored, member}, down_slices});
      }
      e.raises.push_back({{Kind::sums_done, task.tile.expert}, kGroupSumWarps});
      break;
    case ForwardPhase::end:
      break;
  }
  return e;
}

struct ForwardCase {
  HostSchedule routed_rows;
  HostSchedule shared_rows;
  ExpertTiles routed;
  ExpertTiles shared;
  bool has_shared;
  Macrobatches batches;
  std::vector<ForwardTask> order;
  std::vector<TaskEffects> effects;

  explicit ForwardCase(const ForwardShape& s)
      : routed_rows(s.expert_blocks, s.capacity_blocks, s.ring_blocks),
        shared_rows({s.shared_blocks}, s.shared_blocks, 0),
        routed{tiles_of(routed_rows.view, s.up_n_blocks), tiles_of(routed_rows.view, s.down_n_blocks)},
        shared{tiles_of(shared_rows.view, s.up_n_blocks), tiles_of(shared_rows.view, s.down_n_blocks)},
        has_shared(s.shared_blocks > 0) {
    order = forward_order(has_shared ? &shared : nullptr, routed, batches);
    for (const ForwardTask& t : order) effects.push_back(forward_effects(t, has_shared ? &shared : nullptr, routed, batches));
  }
};

// Every tile of both groups once, the shared expert's first, the routed ones macrobatch by
// macrobatch from the last, each macrobatch's up/gate tiles, then its down tiles, then (but for
// macrobatch 0) one group_sums task per block.
void expect_forward_tiles(const ForwardShape& s, const ForwardCase& c) {
  int total_blocks = 0;
  for (int b : s.expert_blocks) total_blocks += b;
  total_blocks = std::min(total_blocks, s.capacity_blocks);
  ASSERT_EQ(c.batches.total_blocks, total_blocks);
  const int ring = s.ring_blocks > 0 ? s.ring_blocks : std::max(total_blocks, 1);
  const int batches = (total_blocks + ring - 1) / ring;
  ASSERT_EQ(c.batches.count(), batches);
  std::vector<std::tuple<ForwardPhase, int, int>> expected;  // phase, m block, n block
  for (int b = 0; b < s.shared_blocks; ++b) {
    for (int n = 0; n < s.up_n_blocks; ++n) expected.emplace_back(ForwardPhase::shared_up_gate, b, n);
  }
  for (int b = 0; b < s.shared_blocks; ++b) {
    for (int n = 0; n < s.down_n_blocks; ++n) expected.emplace_back(ForwardPhase::shared_down, b, n);
  }
  for (int m = batches - 1; m >= 0; --m) {
    const int begin = m * ring, end = std::min(total_blocks, begin + ring);
    for (int b = begin; b < end; ++b) {
      for (int n = 0; n < s.up_n_blocks; ++n) expected.emplace_back(ForwardPhase::up_gate, b, n);
    }
    for (int b = begin; b < end; ++b) {
      for (int n = 0; n < s.down_n_blocks; ++n) expected.emplace_back(ForwardPhase::down, b, n);
    }
    if (m > 0) {
      for (int b = begin; b < end; ++b) expected.emplace_back(ForwardPhase::group_sums, b, 0);
    }
  }
  ASSERT_EQ(c.order.size(), expected.size());
  // Within a phase of a macrobatch the tiles follow RowTileScheduler's order: compare as sets.
  size_t i = 0;
  while (i < expected.size()) {
    size_t j = i;
    const auto same_run = [&](size_t k) {
      const ForwardPhase phase = std::get<0>(expected[i]);
      const bool shared = phase == ForwardPhase::shared_up_gate || phase == ForwardPhase::shared_down;
      return std::get<0>(expected[k]) == phase &&
             (shared || std::get<1>(expected[k]) / ring == std::get<1>(expected[i]) / ring);
    };
    while (j < expected.size() && same_run(j)) ++j;
    std::multiset<std::tuple<ForwardPhase, int, int>> want(expected.begin() + i, expected.begin() + j), got;
    for (size_t k = i; k < j; ++k) {
      const ForwardTask& t = c.order[k];
      got.emplace(t.phase, t.m_block(), t.tile.n_begin / gemm::kBlockN);
      if (t.phase == ForwardPhase::group_sums) {
        const int batch = t.m_block() / ring;
        EXPECT_EQ(t.tile.expert, batch) << "task " << k;
        EXPECT_EQ(t.tile.k_begin, batch * ring * kBlockM) << "task " << k;
        EXPECT_EQ(t.tile.active_end, std::min(total_blocks, (batch + 1) * ring) * kBlockM) << "task " << k;
      }
    }
    EXPECT_EQ(got, want) << "tasks [" << i << ", " << j << ")";
    i = j;
  }
}

// The comm role's pulls into block b's ring rows wait for the up/gate tiles of the block that held
// them (pull_forward_rows); the tasks that read b's pulled rows (its up/gate tiles) must all come
// after those.
std::vector<std::string> forward_pull_breaches(const ForwardCase& c) {
  std::map<int, int> last_activation_raise, first_x_wait;
  for (size_t i = 0; i < c.effects.size(); ++i) {
    for (const auto& [counter, count] : c.effects[i].raises) {
      if (counter.first == Kind::activation_ready) last_activation_raise[counter.second] = static_cast<int>(i);
    }
    for (const Wait& w : c.effects[i].waits) {
      if (w.counter.first == Kind::x_ready && !first_x_wait.count(w.counter.second)) {
        first_x_wait[w.counter.second] = static_cast<int>(i);
      }
    }
  }
  std::vector<std::string> breaches;
  for (const auto& [block, first_reader] : first_x_wait) {
    const int previous = c.batches.previous_in_ring(block);
    if (previous < 0) continue;
    const auto released = last_activation_raise.find(previous);
    if (released == last_activation_raise.end() || released->second >= first_reader) {
      breaches.push_back("the pulls into block " + std::to_string(block) + " wait for up/gate tiles of block " +
                         std::to_string(previous) + " not before task " + std::to_string(first_reader));
    }
  }
  return breaches;
}

const std::vector<ForwardShape> kForwardShapes = {
    {{3, 0, 2}, 8, 0, 0},           // one macrobatch, no shared expert, an empty expert
    {{3, 0, 2}, 8, 0, 2},           // with a shared expert
    {{5}, 5, 5, 1},                 // the ring holds the step
    {{2, 3, 2}, 9, 2, 0},           // four macrobatches, the last partial (7 blocks in rings of 2)
    {{2, 3, 2}, 9, 2, 3, 1, 3},     // with a shared expert, one up/gate N block
    {{4, 1, 0, 4}, 12, 3, 2, 5, 7}, // three macrobatches of 3, odd N blocks
    {{1}, 4, 1, 1},                 // one block
    {{6, 5}, 16, 4, 0, 2, 2},       // an odd block count over rings of 4
    {{2, 2}, 6, 2, 0},              // capacity past the rows: whole macrobatches only
};

TEST(ForwardTaskOrder, EveryTileOnceInTheOrderOfTheTaskList) {
  for (const ForwardShape& s : kForwardShapes) {
    SCOPED_TRACE(::testing::Message() << s);
    const ForwardCase c(s);
    expect_forward_tiles(s, c);
  }
}

TEST(ForwardTaskOrder, TasksWaitOnlyOnTheCommRoleOrEarlierTasks) {
  for (const ForwardShape& s : kForwardShapes) {
    SCOPED_TRACE(::testing::Message() << s);
    const ForwardCase c(s);
    for (const std::string& b : rule_breaches(c.effects)) ADD_FAILURE() << b;
    for (const std::string& b : forward_pull_breaches(c)) ADD_FAILURE() << b;
  }
}

bool same_task(const ForwardTask& a, const ForwardTask& b) {
  return a.phase == b.phase && a.tile.expert == b.tile.expert && a.tile.m_begin == b.tile.m_begin &&
         a.tile.m_buffer == b.tile.m_buffer && a.tile.n_begin == b.tile.n_begin && a.tile.k_begin == b.tile.k_begin &&
         a.tile.k_tiles == b.tile.k_tiles && a.tile.active_end == b.tile.active_end;
}

// The task table's threads (forward_task_table.cu) resolve runs of routed tasks anywhere in the
// order, each run's first placed by bisection over the experts: every task is the one the walk in
// order gives, over empty experts, macrobatches and many experts. A wrong task (the walk's
// neighbour) is told apart.
TEST(ForwardTaskOrder, AnyOrderGivesTheTasksOfTheWalk) {
  std::vector<ForwardShape> shapes = kForwardShapes;
  std::mt19937 rng(7);
  for (int experts : {17, 64, 130}) {
    ForwardShape s{{}, 0, 0, experts % 2, 3, 2};
    int blocks = 0;
    for (int e = 0; e < experts; ++e) {
      s.expert_blocks.push_back(static_cast<int>(rng() % 4));  // a quarter of them empty
      blocks += s.expert_blocks.back();
    }
    s.capacity_blocks = blocks + 2;
    s.ring_blocks = experts == 64 ? 5 : 0;
    shapes.push_back(s);
  }
  for (const ForwardShape& s : shapes) {
    SCOPED_TRACE(::testing::Message() << s);
    const ForwardCase c(s);
    ForwardTaskCursor tasks(c.has_shared ? &c.shared : nullptr, c.routed);
    tasks.count_routed_tasks();
    ASSERT_EQ(tasks.num_tasks(), static_cast<int>(c.order.size()));
    std::vector<int> any_order(c.order.size());
    std::iota(any_order.begin(), any_order.end(), 0);
    std::shuffle(any_order.begin(), any_order.end(), rng);
    int compared = 0;
    for (int t : any_order) {
      if (t < tasks.shared_tasks()) continue;
      const ForwardTask task = tasks.at_any(t);
      EXPECT_TRUE(same_task(task, c.order[static_cast<size_t>(t)])) << "task " << t;
      if (t + 1 < tasks.num_tasks()) {
        EXPECT_FALSE(same_task(task, c.order[static_cast<size_t>(t) + 1])) << "task " << t;
      }
      ++compared;
    }
    EXPECT_EQ(compared, tasks.num_tasks() - tasks.shared_tasks());
    // As the table's threads take them: a run of consecutive tasks, the first anywhere, the others
    // by the walk from it.
    for (int run = 0; run < 20 && tasks.num_tasks() > tasks.shared_tasks(); ++run) {
      const int begin = tasks.shared_tasks() + static_cast<int>(rng() % static_cast<unsigned>(tasks.num_tasks() - tasks.shared_tasks()));
      for (int t = begin; t < std::min(begin + 7, tasks.num_tasks()); ++t) {
        const ForwardTask task = t == begin ? tasks.at_any(t) : tasks.at(t);
        EXPECT_TRUE(same_task(task, c.order[static_cast<size_t>(t)])) << "task " << t << " of the run from " << begin;
      }
    }
  }
}

// The checks can fail: the order walked from the other end, or macrobatch 0 walked first, breaks
// the rule.
TEST(ForwardTaskOrder, TheRuleCatchesAWrongOrder) {
  const ForwardCase c({{2, 3, 2}, 9, 2, 1});
  std::vector<TaskEffects> reversed(c.effects.rbegin(), c.effects.rend());
  EXPECT_FALSE(rule_breaches(reversed).empty());
  // The routed tasks with their macrobatches ascending: each macrobatch's tasks keep their order.
  std::map<int, std::vector<TaskEffects>> by_batch;
  std::vector<TaskEffects> ascending;
  for (size_t i = 0; i < c.order.size(); ++i) {
    if (c.order[i].shared()) {
      ascending.push_back(c.effects[i]);
    } else {
      by_batch[c.order[i].m_block() / c.batches.ring_blocks].push_back(c.effects[i]);
    }
  }
  for (const auto& [batch, effects] : by_batch) ascending.insert(ascending.end(), effects.begin(), effects.end());
  EXPECT_FALSE(rule_breaches(ascending).empty());
}

// A launch of `ctas` CTAs taking the tasks of `order` from one counter, each holding up to `ahead`
// claimed tasks besides the one it runs (forward_task_handoff.cuh's TaskThroughScratch claims one
// ahead), in an interleaving drawn from `seed`: a CTA runs its oldest claimed task once every counter
// it waits on is raised (the comm role's always are), then claims the next. Whether every task ran.
bool launch_completes(const std::vector<TaskEffects>& order, int ctas, int ahead, uint32_t seed) {
  std::mt19937 random(seed);
  std::map<Counter, uint32_t> raised;
  std::vector<std::deque<size_t>> claimed(static_cast<size_t>(ctas));
  size_t counter = 0, ran = 0;
  const auto claim = [&](std::deque<size_t>& tasks) {
    if (counter < order.size()) tasks.push_back(counter);
    ++counter;  // a claim past the end takes a number too, for nothing
  };
  for (int round = 0; round <= ahead; ++round) {
    std::vector<size_t> ctas_in_turn(claimed.size());
    std::iota(ctas_in_turn.begin(), ctas_in_turn.end(), size_t{0});
    std::shuffle(ctas_in_turn.begin(), ctas_in_turn.end(), random);
    for (size_t cta : ctas_in_turn) claim(claimed[cta]);
  }
  const auto can_run = [&](size_t task) {
    for (const Wait& w : order[task].waits) {
      if (!raised_by_comm(w.counter.first) && raised[w.counter] < w.target) return false;
    }
    return true;
  };
  while (ran < order.size()) {
    std::vector<size_t> ready;
    for (size_t cta = 0; cta < claimed.size(); ++cta) {
      if (!claimed[cta].empty() && can_run(claimed[cta].front())) ready.push_back(cta);
    }
    if (ready.empty()) return false;
    std::deque<size_t>& tasks = claimed[ready[random() % ready.size()]];
    for (const auto& [c, count] : order[tasks.front()].raises) raised[c] += count;
    tasks.pop_front();
    ++ran;
    claim(tasks);
  }
  return true;
}

// The no-deadlock rule with claims ahead: any number of CTAs, each claiming up to two tasks ahead,
// finishes every forward order in any interleaving tried; the reversed order stops.
TEST(ForwardTaskOrder, ALaunchClaimingAheadCompletes) {
  for (const ForwardShape& s : kForwardShapes) {
    SCOPED_TRACE(::testing::Message() << s);
    const ForwardCase c(s);
    for (int ctas : {1, 2, 5}) {
      for (int ahead = 0; ahead <= 2; ++ahead) {
        for (uint32_t seed = 0; seed < 20; ++seed) {
          EXPECT_TRUE(launch_completes(c.effects, ctas, ahead, seed))
              << ctas << " CTAs, " << ahead << " ahead, interleaving " << seed;
        }
      }
    }
  }
  const ForwardCase c({{2, 3, 2}, 9, 2, 1});
  const std::vector<TaskEffects> reversed(c.effects.rbegin(), c.effects.rend());
  EXPECT_FALSE(launch_completes(reversed, 2, 1, 0));
}

// ---- The backward ----------------------------------------------------------------------------

struct BackwardShape {
  std::vector<int> expert_blocks;
  int capacity_blocks;
  int ring_blocks;    // the window's rows: ring_blocks blocks from window * ring_blocks
  int window;
  int shared_blocks;  // 0: no shared expert
  int dgrad_n_blocks = 3;
  int dx_n_blocks = 2;
};

std::ostream& operator<<(std::ostream& os, const BackwardShape& s) {
  os << "experts' blocks {";
  for (int b : s.expert_blocks) os << b << ",";
  return os << "}, capacity " << s.capacity_blocks << ", ring " << s.ring_blocks << ", window " << s.window
            << ", shared " << s.shared_blocks << ", N blocks " << s.dgrad_n_blocks << "/" << s.dx_n_blocks;
}

// What a backward task waits on and raises (produce_backward_tiles, consume_backward_tiles).
TaskEffects backward_effects(const BackwardTask& task, const BackwardTiles& tiles) {
  TaskEffects e;
  const int block = task.buffer_block();
  switch (task.phase) {
    case BackwardPhase::shared_dgrad:
      e.raises.push_back({{Kind::shared_dgrad_done, block}, kWarpgroups});
      break;
    case BackwardPhase::shared_dx:
      e.waits.push_back({{Kind::shared_dgrad_done, block}, kWarpgroups * static_cast<uint32_t>(tiles.shared_dgrad.n_blocks)});
      break;
    case BackwardPhase::dgrad:
      e.waits.push_back({{Kind::dy_ready, block}, kBlockM});
      e.raises.push_back({{Kind::dgrad_done, block}, kWarpgroups});
      break;
    case BackwardPhase::dx:
      e.waits.push_back({{Kind::dgrad_done, block}, kWarpgroups * static_cast<uint32_t>(tiles.dgrad.n_blocks)});
      if (tiles.group_dx) e.raises.push_back({{Kind::dx_done, block}, kWarpgroups});
      break;
    case BackwardPhase::end:
      break;
  }
  return e;
}

struct BackwardCase {
  HostSchedule rows;
  HostSchedule shared_rows;
  BackwardTiles tiles;
  std::vector<BackwardTask> order;
  std::vector<TaskEffects> effects;

  explicit BackwardCase(const BackwardShape& s)
      : rows(s.expert_blocks, s.capacity_blocks, s.ring_blocks), shared_rows({s.shared_blocks}, s.shared_blocks, 0) {
    rows.view.first_row = s.window * s.ring_blocks * kBlockM;
    rows.view.end_row = (s.window + 1) * s.ring_blocks * kBlockM;
    tiles = BackwardTiles{tiles_of(rows.view, s.dgrad_n_blocks),
                          tiles_of(rows.view, s.dx_n_blocks),
                          tiles_of(shared_rows.view, s.dgrad_n_blocks),
                          tiles_of(shared_rows.view, s.dx_n_blocks),
                          s.shared_blocks > 0,
                          /*group_dx=*/true};
    BackwardTaskCursor cursor(tiles);  // as produce_backward_tiles takes them
    for (int t = 0; t < cursor.num_tasks(); ++t) order.push_back(cursor.at(t));
    for (const BackwardTask& t : order) effects.push_back(backward_effects(t, tiles));
  }
};

const std::vector<BackwardShape> kBackwardShapes = {
    {{3, 0, 2}, 8, 5, 0, 0},        // one window holds every row
    {{3, 0, 2}, 8, 5, 0, 2},        // with the shared expert (window 0)
    {{2, 3, 2}, 9, 2, 0, 3, 1, 3},  // window 0 of four
    {{2, 3, 2}, 9, 2, 1, 0},        // a middle window: buffer blocks from 0
    {{2, 3, 2}, 9, 2, 3, 0, 5, 1},  // the last, partial window (one block)
    {{4, 1, 0, 4}, 12, 3, 2, 0, 7, 5},
    {{1}, 4, 1, 0, 1},
};

TEST(BackwardTaskOrder, EveryTileOnceInTheOrderOfTheTaskList) {
  for (const BackwardShape& s : kBackwardShapes) {
    SCOPED_TRACE(::testing::Message() << s);
    const BackwardCase c(s);
    int total_blocks = 0;
    for (int b : s.expert_blocks) total_blocks += b;
    const int first = s.window * s.ring_blocks, end = std::min(total_blocks, first + s.ring_blocks);
    std::vector<std::tuple<BackwardPhase, int, int>> expected;  // phase, buffer block, n block
    for (int b = 0; b < s.shared_blocks; ++b) {
      for (int n = 0; n < s.dgrad_n_blocks; ++n) expected.emplace_back(BackwardPhase::shared_dgrad, b, n);
    }
    for (int b = 0; b < s.shared_blocks; ++b) {
      for (int n = 0; n < s.dx_n_blocks; ++n) expected.emplace_back(BackwardPhase::shared_dx, b, n);
    }
    for (int b = first; b < end; ++b) {
      for (int n = 0; n < s.dgrad_n_blocks; ++n) expected.emplace_back(BackwardPhase::dgrad, b - first, n);
    }
    for (int b = first; b < end; ++b) {
      for (int n = 0; n < s.dx_n_blocks; ++n) expected.emplace_back(BackwardPhase::dx, b - first, n);
    }
    ASSERT_EQ(c.order.size(), expected.size());
    // Phase by phase (RowTileScheduler's order within one): compare as sets.
    size_t i = 0;
    while (i < expected.size()) {
      size_t j = i;
      while (j < expected.size() && std::get<0>(expected[j]) == std::get<0>(expected[i])) ++j;
      std::multiset<std::tuple<BackwardPhase, int, int>> want(expected.begin() + i, expected.begin() + j), got;
      for (size_t k = i; k < j; ++k) {
        const BackwardTask& t = c.order[k];
        got.emplace(t.phase, t.buffer_block(), t.tile.n_begin / gemm::kBlockN);
        if (!t.shared()) {
          EXPECT_EQ(t.tile.m_buffer, t.tile.m_begin - first * kBlockM) << "task " << k;
        }
      }
      EXPECT_EQ(got, want) << "tasks [" << i << ", " << j << ")";
      i = j;
    }
  }
}

TEST(BackwardTaskOrder, TasksWaitOnlyOnTheCommRoleOrEarlierTasks) {
  for (const BackwardShape& s : kBackwardShapes) {
    SCOPED_TRACE(::testing::Message() << s);
    const BackwardCase c(s);
    for (const std::string& b : rule_breaches(c.effects)) ADD_FAILURE() << b;
  }
}

// The check can fail: the dx tiles before the dgrad tiles break the rule.
TEST(BackwardTaskOrder, TheRuleCatchesAWrongOrder) {
  const BackwardCase c({{2, 3, 2}, 9, 2, 0, 3});
  std::vector<TaskEffects> dx_first;
  for (const bool dx : {true, false}) {
    for (size_t i = 0; i < c.order.size(); ++i) {
      const bool is_dx = !c.order[i].dgrad();
      if (is_dx == dx) dx_first.push_back(c.effects[i]);
    }
  }
  EXPECT_FALSE(rule_breaches(dx_first).empty());
}

}  // namespace
}  // namespace caracal::fused

#pragma GCC diagnostic pop
