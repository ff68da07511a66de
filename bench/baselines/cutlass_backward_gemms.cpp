#include "cutlass_backward_gemms.hpp"

#include "caracal/error.hpp"

namespace caracal::bench {

namespace {

// What every problem shares: each expert's rows start on a 128-row block.
void check_experts(const CutlassExpertRows& e, const char* what) {
  CARACAL_CHECK(!e.rows.empty() && e.row_begin.size() == e.rows.size(), what,
                ": row_begin and rows must name the same experts, got ", e.row_begin.size(), " and ", e.rows.size());
  for (size_t i = 0; i < e.rows.size(); ++i) {
    CARACAL_CHECK(e.row_begin[i] % 128 == 0 && e.rows[i] >= 0, what, ": expert ", i,
                  "'s rows must start on a 128-row block and number at least 0, got row_begin ", e.row_begin[i],
                  ", rows ", e.rows[i]);
  }
}

}  // namespace

const char* cutlass_backward_schedule_name(CutlassBackwardSchedule schedule) {
  switch (schedule) {
    case CutlassBackwardSchedule::kCooperative: return "cooperative";
    case CutlassBackwardSchedule::kPingpong: return "pingpong";
  }
  return "?";
}

std::unique_ptr<CutlassGroupedGemm> make_cutlass_row_gemm(CutlassBackwardSchedule schedule,
                                                          const CutlassRowGemmProblem& problem) {
  check_experts(problem.experts, "CUTLASS row GEMM baseline");
  return schedule == CutlassBackwardSchedule::kPingpong ? make_cutlass_row_gemm_pingpong(problem)
                                                        : make_cutlass_row_gemm_cooperative(problem);
}

std::unique_ptr<CutlassGroupedGemm> make_cutlass_weight_grads(CutlassBackwardSchedule schedule,
                                                              const CutlassWeightGradProblem& problem) {
  check_experts(problem.experts, "CUTLASS weight-gradient baseline");
  return schedule == CutlassBackwardSchedule::kPingpong ? make_cutlass_weight_grads_pingpong(problem)
                                                        : make_cutlass_weight_grads_cooperative(problem);
}

std::unique_ptr<CutlassGroupedGemm> make_cutlass_fp8_weight_grads(CutlassBackwardSchedule schedule,
                                                                  const CutlassFp8WeightGradProblem& problem) {
  check_experts(problem.experts, "CUTLASS FP8 weight-gradient baseline");
  CARACAL_CHECK(problem.capacity % 128 == 0 && problem.capacity > 0, "CUTLASS FP8 weight-gradient baseline: "
                "capacity must be a positive multiple of 128, got ", problem.capacity);
  return schedule == CutlassBackwardSchedule::kPingpong ? make_cutlass_fp8_weight_grads_pingpong(problem)
                                                        : make_cutlass_fp8_weight_grads_cooperative(problem);
}

}  // namespace caracal::bench
