#pragma once
// The token exchange of an expert-parallel world (DESIGN §2) as standalone launches: the schedule
// table built on the GPU and the four transfers, over any comm::World, thin wrappers around the
// device blocks of src/device/transfer that the fused kernels call directly. Every call only
// enqueues on `stream` (graph-capturable); all buffers live in the world's symmetric heap
// (exchange_buffers.hpp: write inputs and read outputs through world.local_pointer). Cross-rank
// order comes only from the world barriers inside each launch; which launch may rewrite what, and
// the W = 1 path without barriers: docs/ARCHITECTURE.md, "The exchange's protocol".
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "caracal/comm/world.hpp"
#include "caracal/layer_config.hpp"
#include "caracal/schedule_view.hpp"
#include "caracal/transfer/exchange_buffers.hpp"
#include "caracal/transfer/exchange_shape.hpp"
#include "caracal/transfer/routing_fault.hpp"

namespace caracal::transfer {

namespace detail {
struct ExchangeKernels;  // launch shapes and the kernels' arguments (src/transfer/token_exchange.cu)
}  // namespace detail

// Which buffer groups to allocate (the expert-side buffers are R x D each: a benchmark of one
// direction can leave the other out). Router and schedule buffers are always allocated.
struct ExchangeOptions {
  bool forward = true;         // dispatch + combine
  bool backward = true;        // reverse combine + reverse dispatch
  bool shared_expert = false;  // shared_out / shared_dx inputs added in combine / reverse dispatch
  // expert_out (R x D), what combine pushes home; without it only combine_after_fused_forward
  // runs (the fused forward's rows wait in expert_dy's ring).
  bool expert_out = true;
  // expert_dx (R x D), what reverse_dispatch pushes home; without it only
  // reverse_dispatch_filled_dx_slots runs (the dx GEMM stores the rows home itself). Over a ring
  // (ring_rows > 0) it is a ring of that many rows instead: where the fused backward's dx tiles
  // leave the rows of tokens on other ranks, whose groups it sums before one row goes home
  // (src/fused/dx_group_sums.cuh; fused::FusedBackwardArgs).
  bool expert_dx = true;
  // expert_x and expert_dy as a ring of this many rows (a multiple of tile_m, caracal/
  // schedule_view.hpp: schedule row r in buffer row r % ring_rows) instead of R: dispatch and
  // reverse_combine then pull one window of at most ring_rows rows at a time, the fused kernels
  // walk it; needs expert_out off. 0: R rows.
  int ring_rows = 0;
  // SMs the exchange kernels may occupy on the device (all local ranks together); they spin on
  // peers in world barriers, so the rest stay free for other work (a concurrent NCCL collective
  // always progresses). 0 = all but kExchangeFreeSms. In a world of one rank the four transfers
  // wait on nothing (see above) and take every SM.
  int max_sms = 0;
  // One row per route over the links instead of one per (token, rank) (DESIGN §2): what v1 moved,
  // kept to measure both designs side by side. The pulls (dispatch, reverse combine, the fused
  // forward's) read a token's home row once per route instead of once per (token, rank) and pull
  // window (the rows get the same bits either way); combine's expert side pushes each route's
  // g-weighted row alone instead of a sum per (token, rank) (y rounds each route's row to bf16
  // before the home sums them: other bits, within the reference's bounds).
  bool rows_per_route = false;
  // x also in e4m3 (DeepSeek-V3's recipe: quantized once at home, half the bytes pulled): x_codes
  // and x_scales at home, expert_x_codes and expert_x_scales on the expert side
  // (exchange_buffers.hpp), for dispatch_fp8. Needs hidden a multiple of 128 and no ring.
  bool fp8_dispatch = false;
  // dy likewise (dy_codes ... expert_dy_scales, exchange_buffers.hpp), for reverse_combine_fp8.
  // Needs backward, hidden a multiple of 128 and no ring.
  bool fp8_reverse_combine = false;
};

// Which rows a pull (dispatch, reverse_combine) fills: the schedule rows [first_row, end_row)
// (multiples of tile_m; end_row 0: to the end), over a ring (ExchangeOptions::ring_rows) at most
// ring_rows of them from a multiple of it, into buffer rows [0, end_row - first_row).
struct PullRange {
  int first_row = 0;
  int end_row = 0;
  // Real rows the pull leaves alone: dispatch, those an earlier launch left in expert_x; reverse
  // combine, those a later launch pulls (rows and g).
  RowsInPlace in_place = RowsInPlace::kNone;
  // Skip the launch's entry world barrier. Only for a pull that follows, on the same stream and in
  // the same pass, a launch that had it after every rank published the home rows pulled here (x,
  // dy, gates): the rows it writes are this rank's own, which no peer reads. The backward's pulls
  // of later macrobatches, and its second pull of the first, are such.
  bool after_barrier = false;
};

// How the dx slots were filled (reverse_dispatch_filled_dx_slots): a row per route, or one per
// (token, rank, ring window) for the tokens of other ranks and a row per route for the rank's own.
enum class DxSlots { kPerRoute, kPerTokenRank };

class TokenExchange {
 public:
  // Bytes of symmetric heap per rank the buffers take (validates the shape; throws caracal::Error).
  static size_t heap_bytes(const ExchangeShape& shape, int world_size, const ExchangeOptions& options = {});

  // Allocates the buffers in `world`'s heap and prepares the kernels (setup: may synchronize).
  // Throws caracal::Error for an invalid shape (naming the argument) or a heap too small for
  // heap_bytes(). `world` must outlive the exchange.
  TokenExchange(comm::World& world, const ExchangeShape& shape, const ExchangeOptions& options = {});
  ~TokenExchange();
  TokenExchange(const TokenExchange&) = delete;
  TokenExchange& operator=(const TokenExchange&) = delete;

  const ExchangeShape& shape() const { return shape_; }
  const ExchangeSizes& sizes() const { return sizes_; }
  const ExchangeOptions& options() const { return options_; }
  comm::World& world() const { return world_; }
  const ScheduleBuffers& schedule_buffers() const { return schedule_; }
  const RouterBuffers& router_buffers() const { return router_; }
  const ForwardBuffers& forward_buffers() const { return forward_; }
  const BackwardBuffers& backward_buffers() const { return backward_; }
  // Local rank `local_rank`'s schedule as the kernels read it (device pointers; valid after
  // build_schedule has run on the stream): what the grouped GEMMs take as their rows.
  ScheduleView schedule_view(int local_rank) const;

  // The schedule table from every rank's topk_idx, plus the inverse view (route_location), and
  // g (the gates buffer) from topk_scores and topk_idx through `router`, in one launch.
  // Out-of-range expert ids are treated as empty slots and raised by check().
  void build_schedule(const RouterNormalization& router, cudaStream_t stream);
  // expert_x from x (needs a built schedule; options.forward), for the rows of `range`; rows an
  // earlier launch left in expert_x (range.in_place) are not pulled again. In a world of one rank
  // the pulls go by token (src/device/transfer/single_rank_pull.cuh: the same rows).
  void dispatch(cudaStream_t stream, const PullRange& range = {});
  // expert_x_codes and expert_x_scales from x_codes and x_scales, which every rank has written
  // before (options.fp8_dispatch): the rows of the whole schedule, each row's codes and scales the
  // same bits as its home token's. Like dispatch, one entry barrier (none in a world of one rank),
  // and a token's home row read once per (token, rank).
  void dispatch_fp8(cudaStream_t stream);
  // y from expert_out, g (from topk_scores through `router`, which must be the one build_schedule
  // used) and shared_out when options.shared_expert (options.forward and options.expert_out): one
  // g-weighted sum per token group pushed home (src/device/transfer/group_sum.cuh), a group being
  // a token's routes on one rank within a window of `group_rows` schedule rows (0: the whole
  // schedule, one group per (token, rank); the fused forward's windows are its macrobatches).
  // `y`: one destination per local rank (at most transfer::kMaxCombineOutputs, device memory of
  // tokens x hidden bf16) instead of the exchange's y, or empty. In a world of one rank both
  // passes run as one (src/device/transfer/single_rank_combine.cuh: the same bits).
  void combine(const RouterNormalization& router, cudaStream_t stream, int group_rows = 0,
               const std::vector<__nv_bfloat16*>& y = {});
  // y after the fused forward (src/fused/fused_forward.hpp, options.forward and options.backward):
  // it pushed the group sums of the macrobatches it walked before the last; the last, macrobatch 0
  // (schedule rows [0, ring_rows); all rows with ring_rows = 0), waits in expert_dy's buffer rows.
  // This pushes that macrobatch's sums (groups within windows of ring_rows rows), then sums every
  // filled slot as combine does. A launch that fills peers' slots must come after a world barrier
  // that follows the last combine's sums (the fused forward follows build_schedule's).
  void combine_after_fused_forward(const RouterNormalization& router, int ring_rows, cudaStream_t stream,
                                   const std::vector<__nv_bfloat16*>& y = {});
  // expert_dy and expert_gates from dy and gates (options.backward), for the rows of `range`
  // (expert_gates per schedule row, expert_dy per buffer row) but those range.in_place leaves to a
  // later launch (the fused backward pulls them: src/fused/fused_backward.hpp); padding rows always.
  void reverse_combine(cudaStream_t stream, const PullRange& range = {});
  // expert_dy_codes, expert_dy_scales and expert_gates from dy_codes, dy_scales and gates, which
  // every rank has written before (options.fp8_reverse_combine): dispatch_fp8's pull with g, the
  // rows of the whole schedule.
  void reverse_combine_fp8(cudaStream_t stream);
  // dx from expert_dx (+ shared_dx), d_topk_scores from expert_dg (options.backward and
  // options.expert_dx); `router` must be the one build_schedule used.
  void reverse_dispatch(const RouterNormalization& router, cudaStream_t stream);
  // The same from dx_slots that an earlier launch filled (fused::gate_up_dgrad_to_home stores each
  // dx row into its home slot), so without the push of dx rows and the first barrier. A launch that
  // fills peers' dx slots must come after a world barrier that follows the last reverse dispatch's
  // sums (MoELayer's follows reverse_combine's).
  // `slots` says how they were filled: a row per route, or (the fused backward with a ring of
  // expert_dx rows) one per (token, rank, window of ring_rows rows) for the tokens of other ranks,
  // in the slot of the group's highest row.
  void reverse_dispatch_filled_dx_slots(const RouterNormalization& router, cudaStream_t stream,
                                        DxSlots slots = DxSlots::kPerRoute);

  // Throws caracal::Error for the first device failure since the last check: a timed-out wait
  // (World::check) or an out-of-range expert id. Reads pinned memory only: no synchronization.
  void check();

 private:
  friend struct ExchangeInternals;  // the fused kernels' access (src/transfer/exchange_internals.hpp)

  comm::World& world_;
  ExchangeShape shape_;
  ExchangeSizes sizes_;
  ExchangeOptions options_;
  ScheduleBuffers schedule_;
  RouterBuffers router_;
  ForwardBuffers forward_;
  BackwardBuffers backward_;
  RoutingFaultFlag fault_;
  std::unique_ptr<detail::ExchangeKernels> kernels_;  // fixed at setup
};

}  // namespace caracal::transfer
