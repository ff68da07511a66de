#pragma once
// One MoELayer as PyTorch sees it (python/caracal): the layer, the world it owns, and the latest
// forward's context. Layers live in a registry under integer handles, which the traced ops take
// (an int is a constant to torch.compile; an object would need a fake class).
//
// Each layer owns its world: a LoopbackWorld of ep_size virtual ranks, or one rank of an
// NcclWorld whose communicator is made from a unique id the Python side shares through the
// process group's store. The world's heap is sized for this one layer (MoELayer::heap_bytes).
#include <ATen/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "caracal/comm/nccl_bootstrap.hpp"
#include "caracal/comm/world.hpp"
#include "caracal/layer_config.hpp"
#include "caracal/moe_layer.hpp"

namespace caracal::torch_ext {

enum class Backend { kLoopback, kNccl };

struct TorchLayerSpec {
  LayerConfig config;
  Backend backend = Backend::kLoopback;
  int rank = 0;                            // NCCL: this process's rank
  std::optional<ncclUniqueId> unique_id;   // NCCL: shared by every rank
  int device = 0;
  int gemm_ctas = 0;
  int exchange_sms = 0;
  bool fused_forward = true;  // MoELayerOptions::fused_forward
  double timeout_s = 600.0;  // the world's wait timeout
};

struct TorchLayer {
  explicit TorchLayer(const TorchLayerSpec& spec);
  ~TorchLayer();

  LayerConfig config;
  int device;
  comm::NcclComm comm;  // NCCL backend only; declared before the world that uses it
  std::unique_ptr<comm::World> world;
  std::unique_ptr<MoELayer> layer;

  // The latest forward: backward must name it by its id (activations are kept for one forward).
  MoEContext context;
  int64_t forward_id = 0;
  bool shared_scaled = false;
  std::vector<const void*> forward_weights;  // the weight tensors forward was given, by address
  // The bf16 weights the kernels read (fp32 parameters cast by forward), alive until backward.
  std::vector<at::Tensor> kernel_weights;
};

// Registry of live layers. Thread-safe; handles are never reused within a process.
int64_t register_layer(std::shared_ptr<TorchLayer> layer);
std::shared_ptr<TorchLayer> find_layer(int64_t handle);  // throws c10::Error naming the handle
void unregister_layer(int64_t handle);

}  // namespace caracal::torch_ext
