#include "cuda_stream.hpp"

#include "caracal/comm/cuda_check.hpp"

namespace caracal::bench {

Stream::Stream() {
  check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
}

Stream::~Stream() { (void)cudaStreamDestroy(stream_); }

void Stream::sync() const { check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }

}  // namespace caracal::bench
