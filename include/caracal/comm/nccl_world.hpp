#pragma once
// One rank per process (or per thread) over NCCL symmetric memory (NCCL >= 2.28, DESIGN §4): the
// heap is ncclMemAlloc'd, registered as an NCCL_WIN_COLL_SYMMETRIC window, and peers' heaps are
// reached through the window's LSA (load/store accessible) pointers. All ranks must be in one LSA
// team (one NVLink domain). NVLink multicast is never used: no multimem is requested and the
// constructor refuses to run unless NCCL_NVLS_ENABLE=0 (set in the environment by whoever starts the
// process; Caracal never sets it).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include <nccl.h>

#include "caracal/comm/world.hpp"

struct ncclDevComm;

namespace caracal::comm {

class NcclWorld final : public World {
 public:
  // Collective: every rank of `comm` constructs its NcclWorld at the same point, with the same
  // heap size (one thread per GPU: concurrently, from each GPU's thread). `comm` must outlive the
  // world. `heap_bytes_per_rank` is rounded up to a multiple of 256. Makes the communicator's
  // device current on the calling thread. Throws caracal::Error for a null comm, multicast not
  // disabled, ranks outside one LSA team, or NCCL/CUDA failures (naming the call).
  NcclWorld(ncclComm_t comm, size_t heap_bytes_per_rank);
  // Collective as well (deregisters the window); waits for the device to finish first.
  ~NcclWorld() override;

  int rank() const { return first_local_rank(); }
  ncclComm_t comm() const;
  ncclWindow_t window() const;
  // The device communicator made with no barriers, no multimem and no GIN resources; for kernels
  // that call NCCL's device API directly.
  const ncclDevComm& dev_comm() const;

 private:
  struct Resources;

  void rendezvous(cudaStream_t stream) override;
  std::vector<int64_t> all_gather(const std::vector<int64_t>& values) override;

  std::unique_ptr<Resources> nccl_;
};

}  // namespace caracal::comm
