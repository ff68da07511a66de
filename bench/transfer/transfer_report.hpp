#pragma once
// caracal_transfer_bench's output, for either backend: the opening line, a block per direction as
// it completes, the summary table and every figure as JSON. transfer_bytes.hpp says what is counted.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "transfer_case.hpp"

namespace caracal::bench {

void print_header(const cudaDeviceProp& prop, const Options& o, uint64_t seed);
void print_direction(const DirectionResult& r, const Options& o);
void print_table(const std::vector<DirectionResult>& results, const cudaDeviceProp& prop, const Options& o,
                 uint64_t seed);
void write_json(const std::string& path, const std::vector<DirectionResult>& results, const cudaDeviceProp& prop,
                const Options& o, uint64_t seed);

}  // namespace caracal::bench
