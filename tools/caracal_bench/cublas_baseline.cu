#include <cuda_bf16.h>

#include <algorithm>
#include <cstddef>
#include <vector>

#include "baselines.hpp"
#include "caracal/comm/cuda_check.hpp"
#include "caracal/comm/cuda_memory.hpp"
#include "caracal/error.hpp"
#include "cublas_gemm.hpp"
#include "cuda_stream.hpp"
#include "device_buffer.hpp"
#include "device_random.cuh"
#include "event_timer.hpp"

namespace caracal::bench_tool {

namespace {

struct GemmShape {
  int64_t m, n, k;
};

std::vector<GemmShape> layer_gemms(const LayerConfig& c, int64_t tokens) {
  const int64_t R = tokens * c.shape.top_k, D = c.shape.hidden, I = c.shape.intermediate,
                Is = c.shape.num_shared_experts > 0 ? c.shape.shared_intermediate : 0;
  std::vector<GemmShape> gemms = {{R, 2 * I, D}, {R, D, I}};
  if (Is > 0) {
    gemms.push_back({tokens, 2 * Is, D});
    gemms.push_back({tokens, D, Is});
  }
  return gemms;
}

// Operands for every GEMM of `gemms` (each the largest any of them needs), A and B random.
struct DenseOperands {
  comm::DeviceMemory<__nv_bfloat16> a, b, c;

  DenseOperands(const std::vector<GemmShape>& gemms, uint64_t seed, cudaStream_t stream) {
    size_t a_count = 0, b_count = 0, c_count = 0;
    for (const GemmShape& g : gemms) {
      CARACAL_CHECK(g.m < (int64_t(1) << 31) && g.n < (int64_t(1) << 31), "cuBLAS baseline: GEMM too large");
      a_count = std::max(a_count, size_t(g.m * g.k));
      b_count = std::max(b_count, size_t(g.n * g.k));
      c_count = std::max(c_count, size_t(g.m * g.n));
    }
    a = device_buffer<__nv_bfloat16>(a_count, "cudaMalloc(cuBLAS A)");
    b = device_buffer<__nv_bfloat16>(b_count, "cudaMalloc(cuBLAS B)");
    c = device_buffer<__nv_bfloat16>(c_count, "cudaMalloc(cuBLAS C)");
    bench::fill_uniform(a.get(), a_count, seed + 11, -1.0f, 1.0f, stream);
    bench::fill_uniform(b.get(), b_count, seed + 12, -0.05f, 0.05f, stream);
  }
};

}  // namespace

Baseline time_cublas(const LayerConfig& c, int64_t tokens, const BenchOptions& a, int device) {
  check_cuda(cudaSetDevice(device), "cudaSetDevice");
  const std::vector<GemmShape> gemms = layer_gemms(c, tokens);
  const bench::Stream stream;
  const DenseOperands operands(gemms, a.seed, stream.get());
  const bench::CublasHandle handle(stream.get());
  // Row-major C[m][n] = A[m][k] * B[n][k]^T.
  const auto run = [&](const GemmShape& g) {
    bench::cublas_gemm(handle.get(), operands.a.get(), true, operands.b.get(), true, operands.c.get(), CUDA_R_16BF,
                       int(g.m), int(g.n), int(g.k));
  };
  Baseline out;
  out.available = true;
  out.note = "cuBLAS dense bf16 GEMMs of equal FLOPs";
  out.forward_ms = bench::median_ms(stream.get(), a.warmup, a.reps, [&] {
    for (const GemmShape& g : gemms) run(g);
  });
  out.backward_ms = bench::median_ms(stream.get(), a.warmup, a.reps, [&] {
    for (const GemmShape& g : gemms) {
      run(g);
      run(g);
    }
  });
  stream.sync();
  return out;
}

}  // namespace caracal::bench_tool
