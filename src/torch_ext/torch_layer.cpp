#include "torch_ext/torch_layer.hpp"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/util/Exception.h>

#include <chrono>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "caracal/comm/cuda_check.hpp"
#include "caracal/comm/loopback_world.hpp"
#include "caracal/comm/nccl_world.hpp"

namespace caracal::torch_ext {

namespace {

// PyTorch's caching allocator: torch.cuda.memory_allocated() and memory snapshots count what the
// layer takes from it. Blocks go back after the destructor's device synchronization.
comm::DeviceAllocator caching_allocator() {
  return {[](size_t bytes) { return c10::cuda::CUDACachingAllocator::raw_alloc(bytes); },
          [](void* block) { c10::cuda::CUDACachingAllocator::raw_delete(block); }};
}

// The loopback world's heaps come from the caching allocator; an NCCL world's heap is NCCL's
// symmetric window (ncclMemAlloc), which no caching allocator can give.
std::unique_ptr<comm::World> make_world(const TorchLayerSpec& spec, size_t heap, comm::NcclComm& comm) {
  const int world_size = static_cast<int>(spec.config.ep_size);
  if (spec.backend == Backend::kLoopback) {
    return std::make_unique<comm::LoopbackWorld>(world_size, heap, spec.device, caching_allocator());
  }
  comm::require_nccl_environment();
  comm = comm::init_rank(*spec.unique_id, spec.rank, world_size, spec.device);
  return std::make_unique<comm::NcclWorld>(comm.get(), heap);
}

struct Registry {
  std::mutex mutex;
  std::unordered_map<int64_t, std::shared_ptr<TorchLayer>> layers;
  int64_t next_handle = 1;
};

// Never destroyed: layers still registered when the process exits are left to the OS (tearing an
// NCCL world down is collective, and the other ranks may be gone by then).
Registry& registry() {
  static Registry* r = new Registry;
  return *r;
}

}  // namespace

TorchLayer::TorchLayer(const TorchLayerSpec& spec)
    : config(spec.config), device(spec.device), gate_up_layout(spec.gate_up_layout) {
  CARACAL_CHECK(spec.backend == Backend::kLoopback || spec.unique_id.has_value(),
                "caracal: the NCCL backend needs the unique id of the job");
  check_cuda(cudaSetDevice(spec.device), "cudaSetDevice(layer device)");
  MoELayerOptions options;
  options.gemm_ctas = spec.gemm_ctas;
  options.exchange_sms = spec.exchange_sms;
  options.fused_forward = spec.fused_forward;
  options.ring_rows = spec.ring_rows;
  options.bf16_weight_gradients = spec.bf16_weight_gradients;
  options.fp8_weight_gradients = spec.fp8_weight_gradients;
  options.local_allocator = caching_allocator();
  memory = MoELayer::memory(spec.config, options);  // validates the configuration first
  world = make_world(spec, memory.heap, comm);
  world->set_wait_timeout(std::chrono::nanoseconds(static_cast<int64_t>(spec.timeout_s * 1e9)), nullptr);
  check_cuda(cudaStreamSynchronize(nullptr), "cudaStreamSynchronize(layer setup)");  // before any stream's launch
  layer = std::make_unique<MoELayer>(spec.config, *world, options);
}

TorchLayer::~TorchLayer() {
  // The layer's and world's buffers may still be read by enqueued work: the world (NCCL: its
  // destructor) waits for the device; the loopback world frees without waiting, so wait here.
  if (cudaSetDevice(device) == cudaSuccess) (void)cudaDeviceSynchronize();
  layer.reset();
  world.reset();
}

int64_t register_layer(std::shared_ptr<TorchLayer> layer) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const int64_t handle = r.next_handle++;
  r.layers.emplace(handle, std::move(layer));
  return handle;
}

std::shared_ptr<TorchLayer> find_layer(int64_t handle) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  const auto it = r.layers.find(handle);
  TORCH_CHECK_VALUE(it != r.layers.end(), "caracal: layer handle ", handle,
                    " names no live layer (closed, or never created in this process)");
  return it->second;
}

void unregister_layer(int64_t handle) {
  std::shared_ptr<TorchLayer> layer;  // destroyed outside the lock
  Registry& r = registry();
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    const auto it = r.layers.find(handle);
    if (it == r.layers.end()) return;
    layer = std::move(it->second);
    r.layers.erase(it);
  }
}

}  // namespace caracal::torch_ext
