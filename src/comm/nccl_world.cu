// NcclWorld: the symmetric heap as an NCCL symmetric window, peers reached through LSA pointers.
#include "caracal/comm/nccl_world.hpp"

#include <cstdlib>
#include <cstring>
#include <vector>

#include <nccl_device.h>

#include "caracal/comm/cuda_check.hpp"
#include "caracal/comm/cuda_memory.hpp"
#include "caracal/comm/nccl_check.hpp"
#include "caracal/error.hpp"

namespace caracal::comm {
namespace {

// NVLink multicast can take a shared host's GPUs out of service, and Caracal never needs it
// (DESIGN §4). Symmetric window registration may set multicast up on its own when NVLS is
// enabled, so refuse to start unless it is disabled for the whole NCCL library.
void require_multicast_off() {
  const char* nvls = std::getenv("NCCL_NVLS_ENABLE");
  CARACAL_CHECK(nvls != nullptr && std::strcmp(nvls, "0") == 0,
                "NcclWorld: NVLink multicast must stay off: set NCCL_NVLS_ENABLE=0 in the environment before the "
                "process starts (Caracal never sets it); it is ",
                nvls != nullptr ? nvls : "unset");
}

// The device API (nccl_device.h) is compiled into Caracal's kernels, struct layouts included, so
// the NCCL library loaded at run time must be the release whose headers Caracal was built with.
void require_matching_nccl_runtime() {
  int runtime = 0;
  CARACAL_CHECK(ncclGetVersion(&runtime) == ncclSuccess, "NcclWorld: ncclGetVersion failed");
  CARACAL_CHECK(runtime == NCCL_VERSION_CODE, "NcclWorld: the loaded NCCL library is ", runtime / 10000, ".",
                runtime / 100 % 100, ".", runtime % 100, " but Caracal was built with NCCL ", NCCL_MAJOR, ".",
                NCCL_MINOR, ".", NCCL_PATCH,
                " headers, whose device API it inlines; put the matching libnccl.so.2 first on LD_LIBRARY_PATH");
}

WorldShape nccl_shape(ncclComm_t comm) {
  CARACAL_CHECK(comm != nullptr, "NcclWorld: comm must not be null");
  require_matching_nccl_runtime();
  require_multicast_off();
  int world_size = 0;
  int rank = 0;
  int device = 0;
  check_nccl(ncclCommCount(comm, &world_size), "ncclCommCount", comm);
  check_nccl(ncclCommUserRank(comm, &rank), "ncclCommUserRank", comm);
  check_nccl(ncclCommCuDevice(comm, &device), "ncclCommCuDevice", comm);
  return WorldShape{"NcclWorld", world_size, rank, 1, device};
}

size_t round_up(size_t value, size_t multiple) { return (value + multiple - 1) / multiple * multiple; }

// Every rank's heap base as this process maps it. Resolved once at setup, so kernels pay one
// load per peer pointer instead of reading the window's fields.
__global__ void resolve_heaps(ncclWindow_t window, char** heaps, int world_size) {
  for (int r = static_cast<int>(threadIdx.x); r < world_size; r += static_cast<int>(blockDim.x)) {
    heaps[r] = static_cast<char*>(ncclGetLsaPointer(window, 0, r));
  }
}

}  // namespace

// Torn down in reverse order of creation, after the device has finished with the heap.
struct NcclWorld::Resources {
  Resources(ncclComm_t c, int d) : comm(c), device(d) {}
  Resources(const Resources&) = delete;
  Resources& operator=(const Resources&) = delete;
  ~Resources() {
    (void)cudaSetDevice(device);
    (void)cudaDeviceSynchronize();
    if (has_dev_comm) (void)ncclDevCommDestroy(comm, &dev_comm);
    if (window != nullptr) (void)ncclCommWindowDeregister(comm, window);
    if (memory != nullptr) (void)ncclMemFree(memory);
  }

  ncclComm_t comm;
  int device;
  void* memory = nullptr;
  ncclWindow_t window = nullptr;
  ncclDevComm dev_comm{};
  bool has_dev_comm = false;
  DeviceMemory<int> rendezvous_word;
};

NcclWorld::NcclWorld(ncclComm_t comm, size_t heap_bytes_per_rank)
    : World(nccl_shape(comm), heap_bytes_per_rank), nccl_(std::make_unique<Resources>(comm, device())) {
  // Before the window: windows of different sizes would not line up.
  require_same_on_all_ranks("NcclWorld", {"heap_bytes_per_rank"}, {static_cast<int64_t>(this->heap_bytes_per_rank())});
  const size_t bytes = round_up(heap_stride(), NCCL_WIN_REQUIRED_ALIGNMENT);
  check_nccl(ncclMemAlloc(&nccl_->memory, bytes), "ncclMemAlloc(NcclWorld heap)", comm);
  // Zero (barrier state at epoch 0, buffers zero-filled) before any peer can reach this heap.
  check_cuda(cudaMemset(nccl_->memory, 0, bytes), "cudaMemset(NcclWorld heap)");
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize(NcclWorld setup)");
  check_nccl(ncclCommWindowRegister(comm, nccl_->memory, bytes, &nccl_->window, NCCL_WIN_COLL_SYMMETRIC),
             "ncclCommWindowRegister(NcclWorld heap, NCCL_WIN_COLL_SYMMETRIC)", comm);

  ncclDevCommRequirements requirements{};  // no NCCL barriers, no LL all-to-all, no GIN
  requirements.lsaMultimem = false;        // never NVLink multicast
  check_nccl(ncclDevCommCreate(comm, &requirements, &nccl_->dev_comm),
             "ncclDevCommCreate (symmetric memory needs NCCL_CUMEM_ENABLE=1 and all ranks of one node on "
             "NVLink or PCIe P2P)",
             comm);
  nccl_->has_dev_comm = true;
  CARACAL_CHECK(nccl_->dev_comm.lsaSize == world_size() && nccl_->dev_comm.lsaRank == rank(),
                "NcclWorld: every rank must reach every other by load/store (one NVLink domain), but the LSA "
                "team holds ",
                nccl_->dev_comm.lsaSize, " of ", world_size(), " ranks (world rank ", rank(), " is LSA rank ",
                nccl_->dev_comm.lsaRank, ")");

  auto table = device_alloc<char*>(static_cast<size_t>(world_size()), "cudaMalloc(NcclWorld heap table)");
  resolve_heaps<<<1, 128>>>(nccl_->window, table.get(), world_size());
  check_cuda(cudaGetLastError(), "resolve_heaps launch");
  std::vector<char*> heaps(static_cast<size_t>(world_size()));
  check_cuda(cudaMemcpy(heaps.data(), table.get(), heaps.size() * sizeof(char*), cudaMemcpyDeviceToHost),
             "cudaMemcpy(NcclWorld heap table)");
  publish_heaps(heaps);

  nccl_->rendezvous_word = device_alloc<int>(1, "cudaMalloc(NcclWorld rendezvous word)");
  check_cuda(cudaMemset(nccl_->rendezvous_word.get(), 0, sizeof(int)), "cudaMemset(NcclWorld rendezvous word)");
  // Explicitly: no rank leaves setup (and launches a barrier that writes into peers' heaps) before
  // every rank has zeroed its heap.
  rendezvous(nullptr);
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize(NcclWorld setup rendezvous)");
}

NcclWorld::~NcclWorld() = default;

ncclComm_t NcclWorld::comm() const { return nccl_->comm; }
ncclWindow_t NcclWorld::window() const { return nccl_->window; }
const ncclDevComm& NcclWorld::dev_comm() const { return nccl_->dev_comm; }

void NcclWorld::rendezvous(cudaStream_t stream) {
  // An all-reduce completes on a rank only after every rank has entered it, i.e. after everything
  // each rank enqueued before it on its stream. Max of zeros keeps the word at zero.
  int* word = nccl_->rendezvous_word.get();
  check_nccl(ncclAllReduce(word, word, 1, ncclInt32, ncclMax, nccl_->comm, stream), "ncclAllReduce(rendezvous)",
             nccl_->comm);
}

std::vector<int64_t> NcclWorld::all_gather(const std::vector<int64_t>& values) {
  const size_t count = values.size();
  std::vector<int64_t> all(count * static_cast<size_t>(world_size()));
  if (count == 0) return all;
  DeviceMemory<int64_t> device = device_alloc<int64_t>(all.size(), "cudaMalloc(NcclWorld all_gather)");
  int64_t* mine = device.get() + static_cast<size_t>(rank()) * count;
  check_cuda(cudaMemcpy(mine, values.data(), count * sizeof(int64_t), cudaMemcpyHostToDevice),
             "cudaMemcpy(NcclWorld all_gather)");
  check_nccl(ncclAllGather(mine, device.get(), count, ncclInt64, nccl_->comm, nullptr), "ncclAllGather(setup check)",
             nccl_->comm);
  check_cuda(cudaMemcpy(all.data(), device.get(), all.size() * sizeof(int64_t), cudaMemcpyDeviceToHost),
             "cudaMemcpy(NcclWorld all_gather)");
  return all;
}

}  // namespace caracal::comm
