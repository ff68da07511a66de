#pragma once
// One host thread per GPU, each driving its rank of an NCCL world: how the tools run W GPUs in
// one process (caracal bench --backend nccl, caracal-soak --backend nccl).
#include <cstddef>
#include <exception>
#include <thread>
#include <vector>

#include "caracal/comm/cuda_check.hpp"
#include "caracal/comm/nccl_bootstrap.hpp"
#include "caracal/comm/nccl_world.hpp"

namespace caracal::cli {

// Calls body(world, rank) for ranks 0..world_size-1 on GPUs 0..world_size-1, one thread each, every
// rank on an NcclWorld of `heap_bytes` per rank (built by all threads together: construction is
// collective). Rethrows the first failure once every thread has joined.
template <typename Body>
void on_each_gpu(int world_size, size_t heap_bytes, Body body) {
  std::vector<int> devices(static_cast<size_t>(world_size));
  for (int d = 0; d < world_size; ++d) devices[static_cast<size_t>(d)] = d;
  std::vector<comm::NcclComm> comms = comm::init_all(devices);
  std::vector<std::exception_ptr> errors(devices.size());
  std::vector<std::thread> threads;
  for (int d = 0; d < world_size; ++d) {
    threads.emplace_back([&, d] {
      try {
        check_cuda(cudaSetDevice(d), "cudaSetDevice");
        comm::NcclWorld world(comms[static_cast<size_t>(d)].get(), heap_bytes);
        body(world, d);
      } catch (...) {
        errors[static_cast<size_t>(d)] = std::current_exception();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const std::exception_ptr& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace caracal::cli
