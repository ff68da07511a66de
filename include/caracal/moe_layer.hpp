#pragma once
// MoELayer: the expert-parallel MoE layer (DESIGN §1-§2), forward and backward, over the token
// exchange (caracal/transfer/token_exchange.hpp) and the grouped GEMMs (caracal/gemm/). One object
// serves its World's local ranks; every call is collective (every rank, the same calls in order),
// enqueues on `stream` without host synchronization (CUDA-graph capturable) and never drops a
// route. Shapes per rank: T = tokens_per_rank, k = top_k, D = hidden, I = intermediate, Is =
// shared_intermediate, L = num_experts / ep_size (expert e on rank e / L). Numerics: the rounding
// contract of caracal/reference.hpp, bitwise the same across runs, gemm_ctas and exchange_sms.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "caracal/comm/world.hpp"
#include "caracal/gemm/grouped_gemm.hpp"
#include "caracal/layer_config.hpp"

namespace caracal {

// ---- Weight layout ---------------------------------------------------------------------------
// Routed and shared experts read their gate and up projections as one interleaved matrix
// W_gate_up [2I][D] per expert (8 gate rows, 8 up rows, ...: gemm::gate_up_row). Build it from
// separate W_gate, W_up [experts][I][D] with gemm::interleave_gate_up_weights (device) or
// gemm::interleave_gate_up_weights_host; the weight gradients come back in the same layout and
// deinterleave_gate_up_host splits them.
using gemm::gate_up_row;
using gemm::interleave_gate_up_weights;
using gemm::interleave_gate_up_weights_host;

// Inverse of interleave_gate_up_weights_host, for any element type (fp32 gradients, bf16 bits):
// gate_up [experts][2I][D] -> gate, up [experts][I][D].
template <typename T>
void deinterleave_gate_up_host(const T* gate_up, T* gate, T* up, int64_t experts, int64_t intermediate,
                               int64_t hidden) {
  for (int64_t e = 0; e < experts; ++e) {
    for (int64_t j = 0; j < intermediate; ++j) {
      const T* gate_src = gate_up + (e * 2 * intermediate + gate_up_row(j, false)) * hidden;
      const T* up_src = gate_up + (e * 2 * intermediate + gate_up_row(j, true)) * hidden;
      T* gate_dst = gate + (e * intermediate + j) * hidden;
      T* up_dst = up + (e * intermediate + j) * hidden;
      for (int64_t d = 0; d < hidden; ++d) {
        gate_dst[d] = gate_src[d];
        up_dst[d] = up_src[d];
      }
    }
  }
}

// ---- Arguments (device pointers on the world's device) ------------------------------------------

// One rank's expert weights, bf16, 16-byte aligned.
struct MoEWeights {
  const __nv_bfloat16* w_gate_up = nullptr;         // [L][2I][D], its rows as w_gate_up_layout says
  const __nv_bfloat16* w_down = nullptr;            // [L][D][I]
  const __nv_bfloat16* shared_w_gate_up = nullptr;  // [2Is][D], interleaved; only with a shared expert
  const __nv_bfloat16* shared_w_down = nullptr;     // [D][Is]; only with a shared expert
  // The routed experts' W_gate_up rows: interleaved (caracal::gemm::gate_up_row), or [gate; up]
  // halves (Hugging Face's gate_up_proj), read in place; the backward writes d_w_gate_up in the
  // same order. The same bits either way.
  gemm::GateUpLayout w_gate_up_layout = gemm::GateUpLayout::kInterleaved;
  // FP8 layers only (LayerConfig::precision kFP8): the expert weights already quantized, a block
  // of MoELayer::fp8_weight_bytes() bytes that MoELayer::quantize_weights wrote from the routed
  // and shared experts' weights, 256-byte aligned; the layer reads it as it is (so quantize again
  // after each change of the weights, e.g. once per optimizer step). Null: the layer quantizes them
  // into its own block at every forward, replay and backward.
  const void* w_fp8 = nullptr;
};

// One local rank's forward.
struct MoEForwardArgs {
  const __nv_bfloat16* x = nullptr;     // [T][D], 16-byte aligned
  const int32_t* topk_idx = nullptr;    // [T][k] global expert ids, -1 = empty slot
  const float* topk_scores = nullptr;   // [T][k]
  const float* shared_scale = nullptr;  // optional [T]: y = c_t * E_shared(x_t) + ...; needs a
                                        // shared expert; null = all ones
  MoEWeights weights;
  __nv_bfloat16* y = nullptr;           // output [T][D], 16-byte aligned
};

// One local rank's backward. Every output is overwritten (not accumulated).
// Each weight gradient comes in fp32 or in bf16: give exactly one pointer of each pair. bf16 is
// the fp32 sum rounded once to nearest-even bf16 (what autograd yields for bf16 parameters), and
// the kernels store half the bytes.
struct MoEBackwardArgs {
  const __nv_bfloat16* dy = nullptr;   // [T][D], 16-byte aligned
  __nv_bfloat16* dx = nullptr;         // output [T][D], 16-byte aligned
  float* d_topk_scores = nullptr;      // output [T][k]; 0 for empty slots
  float* d_w_gate_up = nullptr;        // output [L][2I][D] fp32, interleaved like w_gate_up
  float* d_w_down = nullptr;           // output [L][D][I] fp32
  float* d_shared_w_gate_up = nullptr; // output [2Is][D] fp32, interleaved; only with a shared expert
  float* d_shared_w_down = nullptr;    // output [D][Is] fp32; only with a shared expert
  float* d_shared_scale = nullptr;     // output [T] <dy_t, E_shared(x_t)>: required exactly when
                                       // the forward was given a shared_scale
  __nv_bfloat16* d_w_gate_up_bf16 = nullptr;         // instead of d_w_gate_up
  __nv_bfloat16* d_w_down_bf16 = nullptr;            // instead of d_w_down
  __nv_bfloat16* d_shared_w_gate_up_bf16 = nullptr;  // instead of d_shared_w_gate_up
  __nv_bfloat16* d_shared_w_down_bf16 = nullptr;     // instead of d_shared_w_down
};

// Where the layer reads its inputs and writes its outputs for one local rank (zero-copy path).
struct MoELayerBuffers {
  __nv_bfloat16* x = nullptr;        // [T][D]
  int32_t* topk_idx = nullptr;       // [T][k]
  float* topk_scores = nullptr;      // [T][k]
  __nv_bfloat16* y = nullptr;        // [T][D]
  __nv_bfloat16* dy = nullptr;       // [T][D]
  __nv_bfloat16* dx = nullptr;       // [T][D]
  float* d_topk_scores = nullptr;    // [T][k]
};

// Where a layer's ordinary device memory (MoELayerMemory::local: the experts' activations) comes
// from, one block per local rank, taken at construction and given back at destruction (after the
// device is idle): comm::DeviceAllocator (cudaMalloc when empty).
using comm::DeviceAllocator;

struct MoELayerOptions {
  int gemm_ctas = 0;  // persistent CTAs of every standalone grouped GEMM; 0 = one per SM (the fused
                      // forward's GEMM tiles run on every SM of its launch). Up to
                      // gemm::kTileQueueMaxCtas (256) they take their row tiles in order from a
                      // tile queue; more take them at a fixed stride (the same bits). The
                      // row-tile GEMMs run CTAs in pairs: an odd count is rounded up
                      // (gemm/grouped_gemm.hpp, "CTA pairs")
  // SMs the token-exchange kernels may occupy (they spin on peers in world barriers); the rest
  // stay free so that other work on the GPU, such as an NCCL collective of DDP/FSDP on another
  // stream, always progresses. 0 = all but transfer::kExchangeFreeSms (16).
  int exchange_sms = 0;
  DeviceAllocator local_allocator;  // both set, or neither
  // The fused path: each pass as one persistent launch (per macrobatch) over a ring of rows
  // (ring_rows): the forward's shared expert, dispatch and routed GEMMs (src/fused/fused_forward.hpp:
  // GEMM tiles start as their rows land), the backward's pulls, dgrad+SwiGLU and dx GEMMs
  // (src/fused/fused_backward.hpp), the weight gradients after it. false: v1's separate launches
  // over buffers of every row. The same weight-gradient bits either way; y (and, at W > 1, dx) sum
  // a token's rows on a rank once per macrobatch (ring_rows(), groups_dx_rows()): the same bits as
  // v1 where the ring holds each rank's rows in one macrobatch. Needs a world of at most 8 ranks
  // (with more it runs v1). Its launches occupy every SM but never wait on another rank, so
  // exchange_sms does not apply to them.
  bool fused_forward = true;
  int fused_comm_ctas = 0;  // pulling CTAs per rank in the fused launches; 0 = fused::default_comm_ctas
  // The fused path's ring (DESIGN §2): the routed experts' rows (x, gate/up, hidden, dy) live in
  // ring_rows rows, walked in macrobatches of that many rows: by the forward from the last one
  // down, so that the ring holds macrobatch 0 when it ends, by the backward from the first one up,
  // recomputing the up/gate tiles of every macrobatch but that one. A multiple of 128; 0 =
  // caracal::default_ring_rows (a balanced step in one macrobatch, for the device's SMs). Any
  // routing runs on any ring: an imbalance only adds macrobatches. The layer's memory follows the
  // ring (MoELayer::memory), not the worst case.
  int ring_rows = 0;
  // Whether backward may be given bf16 weight gradients of the routed experts (d_w_*_bf16). Over a
  // ring shorter than the rows a step can have, an expert cut by a macrobatch's edge carries its
  // fp32 sums to the next macrobatch: fp32 gradients in themselves, bf16 ones in two partial
  // buffers of one expert's gradients (3·D·I floats each: 336 MiB for DeepSeek-V3). A layer built
  // with false leaves them out, and its backward refuses bf16 routed weight gradients.
  bool bf16_weight_gradients = true;
  // FP8 layers (LayerConfig::precision kFP8): the routed experts' weight gradients by FP8 GEMMs on
  // x, dy, d_gate_up and g·activation quantized down their columns (1 x 128 blocks along the tokens,
  // DeepSeek-V3's recipe; in the memory of the e4m3 rows the backward is done with), or, false, by
  // the bf16 GEMMs on the bf16 rows (more exact, slower). bf16 layers ignore it.
  bool fp8_weight_gradients = true;
};

// Bytes one layer takes: `heap` per rank of the world's symmetric heap (size the World with it),
// `local` of ordinary device memory per local rank (the experts' activations).
struct MoELayerMemory {
  size_t heap = 0;
  size_t local = 0;
};

class MoELayer;
namespace layer {
struct LayerExperiments;   // switches for tests and benchmarks (src/layer/layer_experiments.hpp)
struct ExperimentalLayer;  // builds a layer with them
}  // namespace layer

// What backward needs from its forward: which forward it was and its arguments (the activations
// themselves stay in the layer; a forward whose activations were overwritten is replayed from its
// arguments).
class MoEContext {
 public:
  MoEContext() = default;  // empty: backward refuses it
  uint64_t forward_id() const { return forward_id_; }  // 1, 2, ... per layer; 0: empty

 private:
  friend class MoELayer;
  const MoELayer* layer_ = nullptr;
  uint64_t forward_id_ = 0;
  std::vector<MoEForwardArgs> ranks_;  // the forward's arguments, [local ranks]
};

class MoELayer {
 public:
  // Memory for `config` built with `options` on a device of `multiprocessors` SMs, which the
  // default ring follows (0: the current CUDA device's, or 132 — H100, H200 — where there is none;
  // the layer itself uses its world's device). The fused path's row buffers hold its ring; v1's
  // (options.fused_forward false or more than 8 ranks) hold every row the schedule can have, plus
  // an output row per schedule row for its combine to push. Throws caracal::Error for a
  // configuration the layer cannot run (see the constructor). Host only.
  static MoELayerMemory memory(const LayerConfig& config, const MoELayerOptions& options = {},
                               int multiprocessors = 0);
  static size_t heap_bytes(const LayerConfig& config, const MoELayerOptions& options = {}) {
    return memory(config, options).heap;
  }

  // Allocates every buffer from (T, k, D, I, W) and the options (setup: synchronizes): the fused
  // path's routed rows in a ring of MoELayerOptions::ring_rows rows both passes walk in macrobatches,
  // v1's for the worst case (all W*T*k routes on one rank). Collective: checks that every rank has
  // the same configuration and the options that lay out the heap or change what ranks send, as
  // resolved on each (the default ring follows the SM count: give ring_rows on mixed GPUs). Throws
  // caracal::Error, naming the field and the value expected, for an invalid config
  // (LayerConfig::validate), ep_size != world.world_size(), or a world heap smaller than
  // heap_bytes(config, options). `world` must outlive the layer; its current device must be
  // world.device() in every call. Precision FP8: the routed experts in DeepSeek-V3's recipe
  // (gemm::Fp8ExpertPass) on v1's launches, whatever options.fused_forward says; the rows cross
  // ranks in bf16 and are quantized on the expert side; the shared expert stays bf16; W_gate_up
  // interleaved only (MoEWeights::w_gate_up_layout halves is refused by name at forward).
  MoELayer(const LayerConfig& config, comm::World& world, const MoELayerOptions& options = {});
  ~MoELayer();
  MoELayer(const MoELayer&) = delete;
  MoELayer& operator=(const MoELayer&) = delete;

  const LayerConfig& config() const { return config_; }
  comm::World& world() const { return world_; }
  // Zero-copy inputs and outputs: where the layer itself reads x, topk_idx, topk_scores, dy and
  // writes y, dx, d_topk_scores (the world's symmetric heap). Passing exactly those pointers skips
  // a device-to-device copy; any other pointer is copied in or out on `stream`, but y, which combine
  // writes straight into the caller's buffer (up to transfer::kMaxCombineOutputs local ranks).
  // Inputs written there are saved context: unchanged until backward has been enqueued, and
  // rewritten by the next forward (a replay of their forward is refused).
  MoELayerBuffers buffers(int local_rank) const;
  // The fused path's ring (MoELayerOptions::ring_rows, or the default it chose), 0 for v1. y sums a
  // token's rows on a rank once per macrobatch of this many rows (src/device/transfer/group_sum.cuh).
  int ring_rows() const;
  // Whether the backward sums a token's dx rows on each other rank once per macrobatch of
  // ring_rows() before one row goes home (the fused backward at W > 1; one bf16 rounding per group
  // of several rows, src/fused/dx_group_sums.cuh), rather than sending a row per route.
  bool groups_dx_rows() const;

  // FP8 layers: the bytes of one local rank's expert weights quantized (MoEWeights::w_fp8: the
  // routed experts' and the shared expert's), and their quantization from `weights`' w_gate_up and
  // w_down (interleaved) and, with a shared expert, shared_w_gate_up and shared_w_down into `w_fp8`
  // (256-byte aligned device memory of world.device(), that many bytes), enqueued on `stream`: e4m3
  // with 128 x 128 block scales, in both orientations. Throws caracal::Error on a bf16 layer or a
  // bad argument.
  size_t fp8_weight_bytes() const;
  void quantize_weights(const MoEWeights& weights, void* w_fp8, cudaStream_t stream) const;

  // y = MoE(x) for every local rank (ranks.size() == world.local_ranks()). Enqueues on `stream`;
  // throws caracal::Error before enqueuing anything for a bad argument (naming ranks[i] and the
  // field): null or misaligned pointers, pointers not in device memory of world.device(),
  // missing or unexpected shared-expert arguments.
  MoEContext forward(const std::vector<MoEForwardArgs>& ranks, cudaStream_t stream);
  MoEContext forward(const MoEForwardArgs& rank, cudaStream_t stream);  // one local rank

  // Gradients for every local rank of the forward of `context`: any forward of this layer since its
  // last reset(). The buffers hold one forward's activations (schedule, dispatched rows, gate/up,
  // gates, the shared expert's rows), shared by every forward; backward works in place over them,
  // so for an earlier forward than the latest (or after another backward) it first replays what it
  // needs (schedule, gates, dispatch, up/gate GEMMs) from that forward's arguments, bitwise as the
  // first time. So several forwards may be pending and one layer may serve many model layers of one
  // configuration; their inputs (x, topk_idx, topk_scores, shared_scale) must then be outside the
  // layer's buffers and, with the weights, unchanged until the backward. The two roundings v1 adds
  // to the plain math (dW_down from bf16(g * hidden); bf16(c_t * E_shared(x_t)) into combine) are
  // the reference's contract; bf16 weight gradients are rounded once more at the end.
  void backward(const std::vector<MoEBackwardArgs>& ranks, const MoEContext& context, cudaStream_t stream);
  void backward(const MoEBackwardArgs& rank, const MoEContext& context, cudaStream_t stream);

  // The context forward `forward_id` returned, rebuilt from the same arguments (the weights may be
  // other copies of the same values): for callers that keep a forward's arguments rather than its
  // context object, as PyTorch's autograd does. Throws caracal::Error for an id this layer has not
  // returned since its last reset(), or bad arguments (as forward).
  MoEContext context(uint64_t forward_id, const std::vector<MoEForwardArgs>& ranks) const;

  // Throws caracal::Error for the first device failure since the last check: an expert id outside
  // [-1, E) in some rank's topk_idx (the layer treated it as an empty slot; raised once) or a
  // failed cross-rank wait (raised until reset()). Reads pinned memory only: no synchronization.
  // Every cross-rank wait is bounded (World::set_wait_timeout; 10 minutes by default); when one
  // expires the world is aborted: the pass's outputs are poisoned (NaN), every rank's later passes
  // stop at once and poison theirs, World::fault_flag reads 1.0 on the device (gate the optimizer
  // step on it), and check(), forward and backward throw on every rank until reset() on every
  // rank; graph replays behave the same, before and after a reset().
  void check();

  // Brings the layer's world back after a failed wait (collective: every rank calls it, on the
  // stream of its passes; see World::reset: it first waits on the host for the work already on
  // `stream`). Contexts of earlier forwards are refused afterwards (their pass was cut short).
  void reset(cudaStream_t stream);

 private:
  friend struct layer::ExperimentalLayer;
  MoELayer(const LayerConfig& config, comm::World& world, const MoELayerOptions& options,
           const layer::LayerExperiments& experiments);

  struct Impl;  // the layer's state and its plan, v1's or the fused one (src/layer/layer_plan.hpp)

  LayerConfig config_;
  comm::World& world_;
  std::unique_ptr<Impl> impl_;
  uint64_t latest_forward_ = 0;  // the id of the latest forward
  uint64_t held_forward_ = 0;    // the forward whose activations the buffers hold (0: none, as after
                                 // a backward)
  uint64_t reset_floor_ = 0;     // forwards up to this one came before the latest reset()
};

}  // namespace caracal
