#pragma once
// One MoELayer as PyTorch sees it (python/caracal): the layer and the world it owns. Every
// caracal.MoE of one configuration on one caracal.World runs on the same TorchLayer, each with its
// own weights (MoELayer takes them per call and replays an overwritten forward in backward), so a
// model's memory for its MoE layers is one layer's. Nothing per forward is kept here: autograd
// saves the forward's inputs and passes them to backward. Layers live in a registry under integer
// handles, which the traced ops take (as a CPU tensor: torch.compile does not specialize on it).
//
// Each layer owns its world: a LoopbackWorld of ep_size virtual ranks, or one rank of an
// NcclWorld whose communicator is made from a unique id the Python side shares through the
// process group's store. The world's heap is sized for this one layer (MoELayer::heap_bytes).
#include <cstdint>
#include <memory>
#include <optional>

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
  int ring_rows = 0;          // MoELayerOptions::ring_rows
  bool bf16_weight_gradients = true;  // MoELayerOptions::bf16_weight_gradients
  bool fp8_weight_gradients = true;   // MoELayerOptions::fp8_weight_gradients
  double timeout_s = 600.0;  // the world's wait timeout
  gemm::GateUpLayout gate_up_layout = gemm::GateUpLayout::kInterleaved;  // of every w_gate_up it is given
};

struct TorchLayer {
  explicit TorchLayer(const TorchLayerSpec& spec);
  ~TorchLayer();

  LayerConfig config;
  int device;
  gemm::GateUpLayout gate_up_layout;  // MoEWeights::w_gate_up_layout of its calls
  MoELayerMemory memory;  // MoELayer::memory of the configuration and options it was built with
  comm::NcclComm comm;  // NCCL backend only; declared before the world that uses it
  std::unique_ptr<comm::World> world;
  std::unique_ptr<MoELayer> layer;
};

// Registry of live layers. Thread-safe; handles are never reused within a process.
int64_t register_layer(std::shared_ptr<TorchLayer> layer);
std::shared_ptr<TorchLayer> find_layer(int64_t handle);  // throws c10::Error naming the handle
void unregister_layer(int64_t handle);

}  // namespace caracal::torch_ext
