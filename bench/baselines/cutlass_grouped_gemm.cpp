#include "cutlass_grouped_gemm.hpp"

namespace caracal::bench {

const char* cutlass_schedule_name(CutlassSchedule schedule) {
  switch (schedule) {
    case CutlassSchedule::kCooperative: return "cooperative";
    case CutlassSchedule::kPingpong: return "pingpong";
    case CutlassSchedule::kCooperativeOurTile: return "cooperative_128x256";
  }
  return "?";
}

std::unique_ptr<CutlassGroupedGemm> make_cutlass_grouped_gemm(CutlassSchedule schedule,
                                                              const CutlassGroupedProblem& problem) {
  switch (schedule) {
    case CutlassSchedule::kCooperative: return make_cutlass_cooperative(problem);
    case CutlassSchedule::kPingpong: return make_cutlass_pingpong(problem);
    case CutlassSchedule::kCooperativeOurTile: return make_cutlass_cooperative_our_tile(problem);
  }
  return nullptr;
}

}  // namespace caracal::bench
