#include "cutlass_grouped_gemm.hpp"

namespace caracal::bench {

const char* cutlass_schedule_name(CutlassSchedule schedule) {
  return schedule == CutlassSchedule::kCooperative ? "cooperative" : "pingpong";
}

std::unique_ptr<CutlassGroupedGemm> make_cutlass_grouped_gemm(CutlassSchedule schedule,
                                                              const CutlassGroupedProblem& problem) {
  return schedule == CutlassSchedule::kCooperative ? make_cutlass_cooperative(problem) : make_cutlass_pingpong(problem);
}

}  // namespace caracal::bench
