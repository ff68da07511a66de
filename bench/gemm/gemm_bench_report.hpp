#pragma once
// What caracal_gemm_bench prints (--list's table; each case's rows of the results table and its
// spot checks) and writes (--json: every figure and each case's per-expert counts).
#include <vector>

#include <nlohmann/json.hpp>

#include "gemm_bench_run.hpp"
#include "gemm_bench_support.hpp"

namespace caracal::bench {

// The cases' row counts (--list).
void print_case_list(const std::vector<Case>& cases);

void print_results_header();

// The case's rows of the results table and its spot checks; false where a spot check failed.
bool print_case(const Case& c, const CaseResult& r);

nlohmann::json case_json(const Case& c, const CaseResult& r);

}  // namespace caracal::bench
