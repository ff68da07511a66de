// The fused forward's task table (src/fused/forward_task_table.cu) on the GPU: each entry the task
// the cursor's walk in order gives on the host (forward_tasks.cuh), bit for bit, over empty experts,
// all routes on one expert, macrobatches, many experts (past the default shared-memory limit of the
// launch's copy of the offsets and counts), with and without counts and a shared expert; no entry
// written past the last task.
#include <gtest/gtest.h>

#include <cstring>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "gpu_test_util.hpp"
#include "task_table_test_kernels.hpp"

namespace caracal::test {
namespace {

using fused::ExpertTiles;
using fused::ForwardTask;
using gemm::kBlockM;

// One group's schedule in host memory: experts' segments of whole 128-row blocks.
struct HostGroup {
  std::vector<int32_t> offsets{0};
  std::vector<int32_t> counts;
  ExpertTiles tiles{};

  HostGroup(const std::vector<int>& expert_blocks, bool with_counts, int ring_blocks, int up_n, int down_n,
            std::mt19937& rng) {
    for (int blocks : expert_blocks) {
      offsets.push_back(offsets.back() + blocks * kBlockM);
      // Real routes: anywhere in the segment's last block (none for an empty expert).
      counts.push_back(blocks == 0 ? 0 : (blocks - 1) * kBlockM + 1 + int(rng() % kBlockM));
    }
    ScheduleView view;
    view.expert_offset = offsets.data();
    view.expert_count = with_counts ? counts.data() : nullptr;
    view.num_experts = int(expert_blocks.size());
    view.row_capacity = offsets.back() + 2 * kBlockM;
    view.ring_rows = ring_blocks * kBlockM;
    tiles.up = {view, up_n, 4, nullptr};
    tiles.down = {view, down_n, 2, nullptr};
  }
  HostGroup(const HostGroup&) = delete;
};

struct TableCase {
  std::string name;
  std::vector<int> expert_blocks;
  bool with_counts;
  int ring_blocks;  // 0: no ring (one macrobatch)
  bool has_shared;
};

void PrintTo(const TableCase& c, std::ostream* os) { *os << c.name; }

std::vector<TableCase> table_cases() {
  std::mt19937 rng(11);
  const auto random_blocks = [&](int experts, int max_blocks) {
    std::vector<int> blocks;
    for (int e = 0; e < experts; ++e) blocks.push_back(int(rng() % unsigned(max_blocks + 1)));
    return blocks;
  };
  std::vector<int> all_to_one(64, 0);
  all_to_one[37] = 40;
  return {
      {"one_expert", {9}, true, 0, false},
      {"empty_experts_with_shared", random_blocks(17, 3), true, 0, true},
      {"all_to_one", all_to_one, true, 0, false},
      {"no_counts_ring", random_blocks(64, 4), false, 5, true},
      {"many_experts", random_blocks(1500, 2), true, 0, false},
      {"past_the_default_shared_memory", random_blocks(7000, 1), true, 0, true},
      {"no_rows", std::vector<int>(40, 0), true, 0, true},
  };
}

class GpuTaskTable : public testing::TestWithParam<TableCase> {};

TEST_P(GpuTaskTable, EveryEntryIsTheWalksTask) {
  CARACAL_REQUIRE_GPU();
  const TableCase& c = GetParam();
  std::mt19937 rng(std::random_device{}());
  const HostGroup routed(c.expert_blocks, c.with_counts, c.ring_blocks, 3, 2, rng);
  const HostGroup shared({3}, false, 0, 5, 2, rng);
  fused::ForwardTaskCursor walk(c.has_shared ? &shared.tiles : nullptr, routed.tiles);
  walk.count_routed_tasks();
  const int first = walk.shared_tasks();
  std::vector<ForwardTask> expected;
  for (int t = first; t < walk.num_tasks(); ++t) expected.push_back(walk.at(t));
  const size_t spare = 3;  // entries past the last task: left as they were
  const std::vector<ForwardTask> table =
      device_task_table(c.has_shared ? &shared.tiles : nullptr, routed.tiles, expected.size() + spare);
  ASSERT_EQ(table.size(), expected.size() + spare);
  int wrong = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    if (std::memcmp(&table[i], &expected[i], sizeof(ForwardTask)) == 0) continue;
    if (++wrong <= 5) {
      ADD_FAILURE() << "entry " << i << " (task " << first + int(i) << "): phase " << int(table[i].phase) << " m_begin "
                    << table[i].tile.m_begin << " n_begin " << table[i].tile.n_begin << ", expected phase "
                    << int(expected[i].phase) << " m_begin " << expected[i].tile.m_begin << " n_begin "
                    << expected[i].tile.n_begin;
    }
  }
  EXPECT_EQ(wrong, 0) << "of " << expected.size() << " entries";
  std::vector<unsigned char> poison(sizeof(ForwardTask), 0xff);
  for (size_t i = expected.size(); i < table.size(); ++i) {
    EXPECT_EQ(std::memcmp(&table[i], poison.data(), sizeof(ForwardTask)), 0) << "entry " << i << " past the last task";
  }
  // The comparison tells neighbours apart (a table off by one task would fail it).
  for (size_t i = 0; i + 1 < expected.size(); ++i) {
    ASSERT_NE(std::memcmp(&expected[i], &expected[i + 1], sizeof(ForwardTask)), 0) << "entry " << i;
  }
}

std::string case_name(const testing::TestParamInfo<TableCase>& param) { return param.param.name; }

INSTANTIATE_TEST_SUITE_P(Loopback, GpuTaskTable, testing::ValuesIn(table_cases()), case_name);

}  // namespace
}  // namespace caracal::test
