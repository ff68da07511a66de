// The host twin of combine per (token, rank): caracal/combine_groups.hpp. Built with
// -ffp-contract=off: every float operation is the device's (std::fma for __fmaf_rn).
#include "caracal/combine_groups.hpp"

#include <cmath>

#include "caracal/bf16.hpp"
#include "caracal/error.hpp"

namespace caracal {

std::vector<int> combine_group_leaders(const std::vector<SlotPlace>& slots, int group_rows, bool per_route) {
  CARACAL_CHECK(group_rows >= 0, "combine_group_leaders: group_rows must be >= 0, got ", group_rows);
  const auto window = [&](int row) { return group_rows > 0 ? row / group_rows : 0; };
  std::vector<int> leader(slots.size(), -1);
  for (size_t s = 0; s < slots.size(); ++s) {
    if (!slots[s].routed) continue;
    leader[s] = static_cast<int>(s);
    if (per_route) continue;
    for (size_t j = 0; j < slots.size(); ++j) {
      const SlotPlace& other = slots[j];
      const int lead = leader[s];
      if (other.routed && other.rank == slots[s].rank && window(other.row) == window(slots[s].row) &&
          other.row < slots[static_cast<size_t>(lead)].row) {
        leader[s] = static_cast<int>(j);
      }
    }
  }
  return leader;
}

std::vector<uint16_t> combine_token_row(const std::vector<SlotPlace>& slots, const std::vector<float>& gates,
                                        const std::vector<const uint16_t*>& rows, const uint16_t* shared, int64_t hidden,
                                        int group_rows, bool per_route) {
  const std::vector<int> leader = combine_group_leaders(slots, group_rows, per_route);
  std::vector<uint16_t> out(static_cast<size_t>(hidden));
  for (int64_t d = 0; d < hidden; ++d) {
    float acc = shared != nullptr ? bf16_to_float(shared[d]) : 0.0f;
    for (size_t s = 0; s < slots.size(); ++s) {
      if (leader[s] != static_cast<int>(s)) continue;
      float group = 0.0f;
      for (size_t j = 0; j < slots.size(); ++j) {
        if (leader[j] == static_cast<int>(s)) group = std::fma(gates[j], bf16_to_float(rows[j][d]), group);
      }
      acc = acc + bf16_to_float(bf16_bits(group));
    }
    out[static_cast<size_t>(d)] = bf16_bits(acc);
  }
  return out;
}

}  // namespace caracal
