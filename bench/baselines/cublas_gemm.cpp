#include "cublas_gemm.hpp"

#include "caracal/error.hpp"

namespace caracal::bench {

void check_cublas(cublasStatus_t status, const char* what) {
  CARACAL_CHECK(status == CUBLAS_STATUS_SUCCESS, what, " failed: cuBLAS status ", static_cast<int>(status));
}

CublasHandle::CublasHandle(cudaStream_t stream) {
  check_cublas(cublasCreate(&handle_), "cublasCreate");
  const cublasStatus_t status = cublasSetStream(handle_, stream);
  if (status != CUBLAS_STATUS_SUCCESS) (void)cublasDestroy(handle_);
  check_cublas(status, "cublasSetStream");
}

CublasHandle::~CublasHandle() { (void)cublasDestroy(handle_); }

void cublas_gemm(cublasHandle_t handle, const __nv_bfloat16* a, bool a_k_major, const __nv_bfloat16* b,
                 bool b_k_major, void* c, cudaDataType c_type, int m, int n, int k) {
  const float alpha = 1.0f, beta = 0.0f;
  // Column-major view: C^T (n x m) = op(B) * op(A), op turning each stored view into B^T / A^T.
  check_cublas(cublasGemmEx(handle, b_k_major ? CUBLAS_OP_T : CUBLAS_OP_N, a_k_major ? CUBLAS_OP_N : CUBLAS_OP_T, n, m,
                            k, &alpha, b, CUDA_R_16BF, b_k_major ? k : n, a, CUDA_R_16BF, a_k_major ? k : m, &beta, c,
                            c_type, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx");
}

}  // namespace caracal::bench
