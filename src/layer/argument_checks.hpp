#pragma once
// The host-side checks of MoELayer::forward / backward arguments that need no GPU: presence and
// alignment of every pointer, against the layer's sizes. Messages name the call, the rank's
// argument, the field, the shape expected and the value given.
#include <cstddef>
#include <string>
#include <vector>

#include "caracal/moe_layer.hpp"
#include "layer/layer_sizes.hpp"

namespace caracal::layer {

enum class Presence { kRequired, kOptional, kForbidden };

struct PointerArg {
  const void* ptr = nullptr;
  std::string name;   // field, e.g. "weights.w_down"
  std::string shape;  // what it must point to, e.g. "[L=2][D=256][I=128] bf16"
  size_t alignment = 16;
  Presence presence = Presence::kRequired;
  std::string why;    // for kForbidden: why it must be null
};

// `with_output`: y is checked too (not for MoELayer::context, which rebuilds a forward's inputs).
std::vector<PointerArg> forward_pointer_args(const MoEForwardArgs& args, const LayerSizes& sizes,
                                             bool with_output = true);
// `shared_scaled`: the forward was given a shared_scale (then d_shared_scale is required).
std::vector<PointerArg> backward_pointer_args(const MoEBackwardArgs& args, const LayerSizes& sizes,
                                              bool shared_scaled);

// The buffers one rank's backward writes (the null ones left out), with their sizes.
struct OutputBuffer {
  void* data = nullptr;
  size_t bytes = 0;
};
std::vector<OutputBuffer> backward_outputs(const MoEBackwardArgs& args, const LayerSizes& sizes);

// Throws caracal::Error "<fn>: ranks[<local_rank>].<name> ..." for the first pointer that is null
// but required, given but forbidden, or misaligned.
void check_pointer_args(const std::vector<PointerArg>& args, const char* fn, int local_rank);

// Throws caracal::Error "<fn>: ranks[<local_rank>].weights.w_gate_up_layout ..." unless it is one
// of gemm::GateUpLayout's values.
void check_gate_up_layout(const MoEWeights& weights, const char* fn, int local_rank);

// One argument struct per local rank.
void check_rank_count(size_t given, int local_ranks, const char* fn);

}  // namespace caracal::layer
