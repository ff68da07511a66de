#pragma once
// cuBLAS for the dense baselines of caracal_gemm_bench and caracal bench: bf16 operands, fp32
// compute, on the operand layouts Caracal's kernels read.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace caracal::bench {

// Throws caracal::Error naming `what` unless `status` is CUBLAS_STATUS_SUCCESS.
void check_cublas(cublasStatus_t status, const char* what);

// A cuBLAS handle whose work goes to `stream`, destroyed with the object.
class CublasHandle {
 public:
  explicit CublasHandle(cudaStream_t stream);
  ~CublasHandle();
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
  cublasHandle_t get() const { return handle_; }

 private:
  cublasHandle_t handle_ = nullptr;
};

// C[m][n] (row-major, c_type bf16 or fp32) = sum_k A(m, k) B(k, n). A is stored [m][k]
// (a_k_major) or [k][m]; B is stored [n][k] (b_k_major) or [k][n].
void cublas_gemm(cublasHandle_t handle, const __nv_bfloat16* a, bool a_k_major, const __nv_bfloat16* b,
                 bool b_k_major, void* c, cudaDataType c_type, int m, int n, int k);

}  // namespace caracal::bench
