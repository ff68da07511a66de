// TokenExchange: buffers in the symmetric heap, launch shapes fixed at setup, one launch per call.
#include <cmath>

#include "caracal/block_fp8.hpp"
#include "caracal/comm/heap_allocator.hpp"
#include "caracal/error.hpp"
#include "caracal/transfer/token_exchange.hpp"
#include "transfer/exchange_internals.hpp"
#include "transfer/exchange_launch.hpp"

namespace caracal::transfer {

namespace {

// Takes every buffer from the heap in one fixed order, so that every rank gets the same offsets;
// without a world it only adds up the bytes (heap_bytes).
class HeapLayout {
 public:
  explicit HeapLayout(comm::World* world) : world_(world) {}

  template <typename T>
  Sym<T> take(int64_t count) {
    const size_t bytes = static_cast<size_t>(count) * sizeof(T);
    constexpr size_t kAlignment = comm::SymmetricHeapAllocator::kAlignment;
    bytes_ += (bytes + kAlignment - 1) / kAlignment * kAlignment;
    return world_ != nullptr ? world_->allocate<T>(static_cast<size_t>(count)) : Sym<T>{};
  }
  // `rows` rows of `row_bytes` each (ExchangeSizes::pulled_row_bytes), as elements of T.
  template <typename T>
  Sym<T> take_rows(int64_t rows, int64_t row_bytes) {
    return take<T>(rows * row_bytes / static_cast<int64_t>(sizeof(T)));
  }
  size_t bytes() const { return bytes_; }

 private:
  comm::World* world_;
  size_t bytes_ = 0;
};

struct Buffers {
  ScheduleBuffers schedule;
  RouterBuffers router;
  ForwardBuffers forward;
  BackwardBuffers backward;
};

Buffers lay_out(HeapLayout& heap, const ExchangeShape& shape, const ExchangeSizes& sizes,
                const ExchangeOptions& options) {
  const int64_t T = shape.tokens;
  const int64_t D = shape.hidden;
  const int64_t L = sizes.local_experts;
  const int64_t W = sizes.world_size;
  const int64_t routes = sizes.routes;
  const int64_t rows = sizes.row_capacity;
  const int64_t pulled_rows = options.ring_rows > 0 ? options.ring_rows : rows;  // expert_x, expert_dy
  const int64_t row_bytes = sizes.pulled_row_bytes;  // x, expert_x, dy, expert_dy
  Buffers b;
  b.schedule.topk_idx = heap.take<int32_t>(routes);
  b.schedule.rows = heap.take<int2>(rows);
  b.schedule.expert_offset = heap.take<int32_t>(L + 1);
  b.schedule.expert_count = heap.take<int32_t>(L);
  b.schedule.source_count = heap.take<int32_t>(L * W);
  b.schedule.route_location = heap.take<int2>(routes);
  b.schedule.route_rows = heap.take<int32_t>(W * routes);
  b.schedule.chunk_counts = heap.take<int32_t>(W * sizes.chunks * L);
  b.schedule.block_counts = heap.take<int32_t>(W * sizes.blocks * L);
  b.router.topk_scores = heap.take<float>(routes);
  b.router.gates = heap.take<float>(routes);
  b.router.d_topk_scores = heap.take<float>(routes);
  if (options.forward) {
    b.forward.x = heap.take_rows<LayerRow>(T, row_bytes);
    b.forward.expert_x = heap.take_rows<LayerRow>(pulled_rows, row_bytes);
    if (options.expert_out) b.forward.expert_out = heap.take<__nv_bfloat16>(rows * D);
    b.forward.combine_slots = heap.take<__nv_bfloat16>(routes * D);
    if (options.shared_expert) b.forward.shared_out = heap.take<__nv_bfloat16>(T * D);
    b.forward.y = heap.take<__nv_bfloat16>(T * D);
    if (options.fp8_dispatch) {
      const int64_t blocks = D / kFp8Block;
      b.forward.x_codes = heap.take<__nv_fp8_e4m3>(sizes.home_rows * D);
      b.forward.x_scales = heap.take<float>(blocks * sizes.home_rows);
      b.forward.expert_x_codes = heap.take<__nv_fp8_e4m3>(rows * D);
      b.forward.expert_x_scales = heap.take<float>(blocks * rows);
    }
  }
  if (options.backward) {
    b.backward.dy = heap.take_rows<LayerRow>(T, row_bytes);
    b.backward.expert_dy = heap.take_rows<LayerRow>(pulled_rows, row_bytes);
    b.backward.expert_gates = heap.take<float>(rows);
    if (options.expert_dx) b.backward.expert_dx = heap.take<__nv_bfloat16>(pulled_rows * D);
    b.backward.expert_dg = heap.take<float>(rows);
    // The forward's slots, when there are any: combine has summed them before the backward's
    // first launch, and the next forward fills them only after the reverse dispatch's sums
    // (token_exchange.hpp, protocol).
    b.backward.dx_slots = options.forward ? b.forward.combine_slots : heap.take<__nv_bfloat16>(routes * D);
    b.backward.dg_slots = heap.take<float>(routes);
    if (options.shared_expert) b.backward.shared_dx = heap.take<__nv_bfloat16>(T * D);
    b.backward.dx = heap.take<__nv_bfloat16>(T * D);
    if (options.fp8_reverse_combine) {
      const int64_t blocks = D / kFp8Block;
      b.backward.dy_codes = heap.take<__nv_fp8_e4m3>(sizes.home_rows * D);
      b.backward.dy_scales = heap.take<float>(blocks * sizes.home_rows);
      b.backward.expert_dy_codes = heap.take<__nv_fp8_e4m3>(rows * D);
      b.backward.expert_dy_scales = heap.take<float>(blocks * rows);
    }
  }
  return b;
}

// Segments are padded to tile_m rows, so a rank's schedule has at most R rounded down to them.
int most_schedule_rows(const ExchangeShape& shape, const ExchangeSizes& sizes) {
  return static_cast<int>(sizes.row_capacity / shape.tile_m * shape.tile_m);
}

// Throws caracal::Error unless `options` suit `shape` and a schedule of at most `schedule_rows` rows.
void check_options(const ExchangeShape& shape, const ExchangeOptions& options, int schedule_rows) {
  const int tile_m = static_cast<int>(shape.tile_m);
  CARACAL_CHECK(options.ring_rows >= 0 && options.ring_rows % tile_m == 0 && options.ring_rows <= schedule_rows,
                "TokenExchange: options.ring_rows must be 0 or a multiple of tile_m (", tile_m,
                ") up to the schedule's ", schedule_rows, " rows, got ", options.ring_rows);
  CARACAL_CHECK(options.ring_rows == 0 || !options.expert_out,
                "TokenExchange: options.ring_rows > 0 needs expert_out = false (combine pushes rows of the whole "
                "schedule, which a ring does not hold)");
  CARACAL_CHECK(!options.fp8_dispatch || (options.forward && options.ring_rows == 0 && shape.hidden % kFp8Block == 0),
                "TokenExchange: options.fp8_dispatch needs options.forward, ring_rows = 0 and hidden a multiple of ",
                kFp8Block, " (one scale per 1 x ", kFp8Block, " block), got forward = ", options.forward,
                ", ring_rows = ", options.ring_rows, ", hidden = ", shape.hidden);
  CARACAL_CHECK(!options.fp8_reverse_combine ||
                    (options.backward && options.ring_rows == 0 && shape.hidden % kFp8Block == 0),
                "TokenExchange: options.fp8_reverse_combine needs options.backward, ring_rows = 0 and hidden a "
                "multiple of ", kFp8Block, ", got backward = ", options.backward, ", ring_rows = ", options.ring_rows,
                ", hidden = ", shape.hidden);
}

// Throws caracal::Error unless [first_row, end_row) is a window `name` can pull: the whole schedule
// ({0, 0}) without a ring, at most ring_rows rows from a multiple of ring_rows over one.
void check_window(const char* name, int first_row, int end_row, int ring_rows, int schedule_rows, int tile_m) {
  CARACAL_CHECK(first_row >= 0 && first_row % tile_m == 0 && first_row <= schedule_rows &&
                    (end_row == 0 || (end_row > first_row && end_row % tile_m == 0 && end_row <= schedule_rows)),
                name, ": the window [first_row, end_row) must be multiples of tile_m (", tile_m,
                ") with first_row < end_row <= ", schedule_rows, " (end_row 0: to the end), got [", first_row, ", ",
                end_row, ")");
  CARACAL_CHECK(ring_rows == 0 || (first_row % ring_rows == 0 && end_row > 0 && end_row - first_row <= ring_rows),
                name, ": over a ring of ", ring_rows,
                " rows (ExchangeOptions::ring_rows) the window must start at a multiple of it and hold at most "
                "that many rows, got [",
                first_row, ", ", end_row, ")");
}

RouterScaling scaling_of(const RouterNormalization& router) {
  CARACAL_CHECK(std::isfinite(router.scale), "TokenExchange: router scale must be finite, got ", router.scale);
  return RouterScaling{static_cast<float>(router.scale), router.normalize};
}

}  // namespace

namespace detail {

int single_rank_chunks(const ExchangeShape& exchange) {
  const int64_t chunks = exchange.tokens * ((exchange.hidden / kBf16PerVector + kWarpSize - 1) / kWarpSize);
  CARACAL_CHECK(chunks <= INT32_MAX, "TokenExchange: tokens x ceil(hidden / 256) must fit in 32 bits, got ", chunks);
  return static_cast<int>(chunks);
}

bool runs_single_rank_pulls(const comm::World& world) { return world.world_size() == 1; }

// A pull's kernel, across ranks or in a world of one rank, and its launch shape.
struct PullLaunch {
  PullKernel kernel = nullptr;
  comm::LaunchShape shape;
};

}  // namespace detail

struct detail::ExchangeKernels {
  comm::LaunchShape schedule;
  bool single_rank_pulls = false;  // dispatch, reverse combine and reverse dispatch by token
                                   // (detail::runs_single_rank_pulls)
  PullLaunch dispatch;
  PullLaunch dispatch_fp8;         // with ExchangeOptions::fp8_dispatch
  PullLaunch reverse_combine_fp8;  // with ExchangeOptions::fp8_reverse_combine
  PullLaunch reverse_combine;
  comm::LaunchShape combine;
  bool single_rank_combine = false;  // combine in one pass (detail::runs_single_rank_combine)
  comm::LaunchShape reverse_dispatch;
  detail::ExchangeArgs args;  // scaling is filled in per call
};

size_t TokenExchange::heap_bytes(const ExchangeShape& shape, int world_size, const ExchangeOptions& options) {
  const ExchangeSizes sizes = exchange_sizes(shape, world_size);
  check_options(shape, options, most_schedule_rows(shape, sizes));
  HeapLayout heap(nullptr);
  (void)lay_out(heap, shape, sizes, options);
  return heap.bytes();
}

TokenExchange::TokenExchange(comm::World& world, const ExchangeShape& shape, const ExchangeOptions& options)
    : world_(world), shape_(shape), sizes_(exchange_sizes(shape, world.world_size())), options_(options) {
  check_options(shape_, options, most_schedule_rows(shape_, sizes_));
  const size_t needed = heap_bytes(shape, world.world_size(), options);
  CARACAL_CHECK(needed <= world.heap_bytes_left(), "TokenExchange: needs ", needed,
                " bytes of symmetric heap per rank (TokenExchange::heap_bytes), but the world has ",
                world.heap_bytes_left(), " left");
  HeapLayout heap(&world);
  const Buffers b = lay_out(heap, shape, sizes_, options);
  schedule_ = b.schedule;
  router_ = b.router;
  forward_ = b.forward;
  backward_ = b.backward;

  CARACAL_CHECK(options.max_sms >= 0, "TokenExchange: options.max_sms must be >= 0 (0: all but ",
                kExchangeFreeSms, " SMs), got ", options.max_sms);
  const int sm_budget = detail::exchange_sm_budget(world, options.max_sms);
  kernels_ = std::make_unique<detail::ExchangeKernels>();
  kernels_->schedule = detail::schedule_launch_shape(world, sm_budget, sizes_);
  kernels_->single_rank_pulls = detail::runs_single_rank_pulls(world);
  const auto pull = [&](detail::PullKernel across_ranks, detail::PullKernel single_rank) -> detail::PullLaunch {
    if (kernels_->single_rank_pulls) {
      return {single_rank, detail::single_rank_launch_shape(world, shape_, kPullThreads, 0, single_rank)};
    }
    return {across_ranks, detail::pull_launch_shape(world, sm_budget, sizes_, across_ranks)};
  };
  kernels_->dispatch = pull(detail::dispatch_pull_kernel(), detail::dispatch_single_rank_pull_kernel());
  if (options.fp8_dispatch) {
    kernels_->dispatch_fp8 = pull(detail::dispatch_fp8_pull_kernel(), detail::dispatch_fp8_single_rank_pull_kernel());
  }
  kernels_->reverse_combine =
      pull(detail::reverse_combine_pull_kernel(), detail::reverse_combine_single_rank_pull_kernel());
  if (options.fp8_reverse_combine) {
    kernels_->reverse_combine_fp8 =
        pull(detail::reverse_combine_fp8_pull_kernel(), detail::reverse_combine_fp8_single_rank_pull_kernel());
  }
  kernels_->single_rank_combine = detail::runs_single_rank_combine(world, shape_);
  kernels_->combine = kernels_->single_rank_combine ? detail::combine_single_rank_launch_shape(world, shape_)
                                                    : detail::combine_launch_shape(world, sm_budget, shape_, sizes_);
  kernels_->reverse_dispatch = kernels_->single_rank_pulls
                                   ? detail::reverse_dispatch_single_rank_launch_shape(world, shape_)
                                   : detail::reverse_dispatch_launch_shape(world, sm_budget, shape_, sizes_);

  detail::ExchangeArgs& a = kernels_->args;
  a.tokens = static_cast<int>(shape_.tokens);
  a.top_k = static_cast<int>(shape_.top_k);
  a.hidden = static_cast<int>(shape_.hidden);
  a.num_experts = static_cast<int>(shape_.num_experts);
  a.schedule.routes = static_cast<int>(sizes_.routes);
  a.schedule.top_k = a.top_k;
  a.schedule.num_experts = a.num_experts;
  a.schedule.local_experts = static_cast<int>(sizes_.local_experts);
  a.schedule.world_size = static_cast<int>(sizes_.world_size);
  a.schedule.tile_m = static_cast<int>(shape_.tile_m);
  a.schedule.chunks = static_cast<int>(sizes_.chunks);
  a.schedule.blocks = static_cast<int>(sizes_.blocks);
  a.schedule.row_capacity = most_schedule_rows(shape_, sizes_);
  a.schedule.buffers = schedule_;
  a.schedule.fault = fault_.sink();
  a.router = router_;
  a.forward = forward_;
  a.backward = backward_;
  a.has_shared = options_.shared_expert;
  a.rows_per_route = options_.rows_per_route;
  a.window = {0, a.schedule.row_capacity, 0};
  a.fp8_zero_scale = block_scale(0.0f, ScaleRounding::kExact).scale;
  a.fp8_home_rows = static_cast<int>(sizes_.home_rows);
}

TokenExchange::~TokenExchange() = default;

ScheduleView TokenExchange::schedule_view(int local_rank) const {
  const auto at = [&](auto ptr) { return world_.local_pointer(ptr, local_rank); };
  return ScheduleView{at(schedule_.expert_offset), at(schedule_.expert_count), static_cast<int>(sizes_.local_experts),
                      most_schedule_rows(shape_, sizes_), options_.ring_rows, at(schedule_.rows)};
}

const detail::ExchangeArgs& ExchangeInternals::kernel_args(const TokenExchange& exchange) {
  return exchange.kernels_->args;
}

namespace {

// The kernels' arguments for a pull of `range` (checked; `name` for errors).
detail::ExchangeArgs pull_args(const TokenExchange& exchange, const detail::ExchangeKernels& kernels,
                               const char* name, const PullRange& range) {
  const int schedule_rows = most_schedule_rows(exchange.shape(), exchange.sizes());
  check_window(name, range.first_row, range.end_row, exchange.options().ring_rows, schedule_rows,
               static_cast<int>(exchange.shape().tile_m));
  detail::ExchangeArgs args = kernels.args;
  args.window = {range.first_row, range.end_row > 0 ? range.end_row : schedule_rows, exchange.options().ring_rows,
                 range.in_place, !range.after_barrier};
  return args;
}

// combine's and reverse dispatch's launches, in two passes or in one (a world of one rank).
void launch_combine(comm::World& world, const detail::ExchangeKernels& kernels, const detail::ExchangeArgs& args,
                    cudaStream_t stream) {
  if (kernels.single_rank_combine) {
    detail::launch_combine_single_rank(world, kernels.combine, args, stream);
  } else {
    detail::launch_combine(world, kernels.combine, args, stream);
  }
}
void launch_reverse_dispatch(comm::World& world, const detail::ExchangeKernels& kernels,
                             const detail::ExchangeArgs& args, cudaStream_t stream, bool push_dx) {
  if (kernels.single_rank_pulls) {
    detail::launch_reverse_dispatch_single_rank(world, kernels.reverse_dispatch, args, stream, push_dx);
  } else {
    detail::launch_reverse_dispatch(world, kernels.reverse_dispatch, args, stream, push_dx);
  }
}

}  // namespace

void TokenExchange::build_schedule(const RouterNormalization& router, cudaStream_t stream) {
  detail::ExchangeArgs args = kernels_->args;
  args.scaling = scaling_of(router);
  detail::launch_schedule(world_, kernels_->schedule, args, stream);
}

void TokenExchange::dispatch(cudaStream_t stream, const PullRange& range) {
  CARACAL_CHECK(options_.forward, "TokenExchange::dispatch needs ExchangeOptions::forward = true");
  const char* name = "TokenExchange::dispatch";
  const detail::ExchangeArgs args = pull_args(*this, *kernels_, name, range);
  comm::launch(world_, name, kernels_->dispatch.shape, stream, kernels_->dispatch.kernel, args);
}

void TokenExchange::reverse_combine_fp8(cudaStream_t stream) {
  CARACAL_CHECK(options_.fp8_reverse_combine,
                "TokenExchange::reverse_combine_fp8 needs ExchangeOptions::fp8_reverse_combine = true");
  const char* name = "TokenExchange::reverse_combine_fp8";
  const detail::ExchangeArgs args = pull_args(*this, *kernels_, name, PullRange{});
  comm::launch(world_, name, kernels_->reverse_combine_fp8.shape, stream, kernels_->reverse_combine_fp8.kernel, args);
}

void TokenExchange::dispatch_fp8(cudaStream_t stream) {
  CARACAL_CHECK(options_.fp8_dispatch, "TokenExchange::dispatch_fp8 needs ExchangeOptions::fp8_dispatch = true");
  const char* name = "TokenExchange::dispatch_fp8";
  const detail::ExchangeArgs args = pull_args(*this, *kernels_, name, PullRange{});
  comm::launch(world_, name, kernels_->dispatch_fp8.shape, stream, kernels_->dispatch_fp8.kernel, args);
}

namespace {

// combine's y destinations (TokenExchange::combine): one per local rank, or none.
void set_y_outputs(CombinePush& push, const std::vector<__nv_bfloat16*>& y, int local_ranks,
                   const char* what) {
  if (y.empty()) return;
  CARACAL_CHECK(static_cast<int>(y.size()) == local_ranks, what, ": y must hold one destination per local rank (",
                local_ranks, "), got ", y.size());
  CARACAL_CHECK(local_ranks <= kMaxCombineOutputs, what, ": y destinations serve at most ", kMaxCombineOutputs,
                " local ranks, the world has ", local_ranks);
  for (int l = 0; l < local_ranks; ++l) {
    CARACAL_CHECK(y[static_cast<size_t>(l)] != nullptr, what, ": y[", l, "] must not be null");
    push.y_out[l] = y[static_cast<size_t>(l)];
  }
}

}  // namespace

void TokenExchange::combine(const RouterNormalization& router, cudaStream_t stream, int group_rows,
                            const std::vector<__nv_bfloat16*>& y) {
  CARACAL_CHECK(options_.forward && options_.expert_out,
                "TokenExchange::combine needs ExchangeOptions::forward = true and expert_out = true");
  CARACAL_CHECK(group_rows >= 0, "TokenExchange::combine: group_rows must be >= 0 (0: the whole schedule), got ",
                group_rows);
  detail::ExchangeArgs args = kernels_->args;
  args.scaling = scaling_of(router);
  args.combine = {forward_.expert_out, 0, group_rows};
  set_y_outputs(args.combine, y, world_.local_ranks(), "TokenExchange::combine");
  launch_combine(world_, *kernels_, args, stream);
}

void TokenExchange::combine_after_fused_forward(const RouterNormalization& router, int ring_rows, cudaStream_t stream,
                                                const std::vector<__nv_bfloat16*>& y) {
  CARACAL_CHECK(options_.forward && options_.backward,
                "TokenExchange::combine_after_fused_forward needs ExchangeOptions::forward = true and backward = true "
                "(the rows wait in expert_dy)");
  CARACAL_CHECK(ring_rows >= 0 && ring_rows % shape_.tile_m == 0,
                "TokenExchange::combine_after_fused_forward: ring_rows must be 0 or a multiple of tile_m = ",
                shape_.tile_m, ", got ", ring_rows);
  detail::ExchangeArgs args = kernels_->args;
  args.scaling = scaling_of(router);
  args.combine = {backward_.expert_dy, ring_rows, ring_rows};
  set_y_outputs(args.combine, y, world_.local_ranks(), "TokenExchange::combine_after_fused_forward");
  launch_combine(world_, *kernels_, args, stream);
}

void TokenExchange::reverse_combine(cudaStream_t stream, const PullRange& range) {
  CARACAL_CHECK(options_.backward, "TokenExchange::reverse_combine needs ExchangeOptions::backward = true");
  const char* name = "TokenExchange::reverse_combine";
  const detail::ExchangeArgs args = pull_args(*this, *kernels_, name, range);
  comm::launch(world_, name, kernels_->reverse_combine.shape, stream, kernels_->reverse_combine.kernel, args);
}

void TokenExchange::reverse_dispatch(const RouterNormalization& router, cudaStream_t stream) {
  CARACAL_CHECK(options_.backward && options_.expert_dx && options_.ring_rows == 0,
                "TokenExchange::reverse_dispatch needs ExchangeOptions::backward = true, expert_dx = true and no ring "
                "(it pushes expert_dx rows of the whole schedule)");
  detail::ExchangeArgs args = kernels_->args;
  args.scaling = scaling_of(router);
  launch_reverse_dispatch(world_, *kernels_, args, stream, /*push_dx=*/true);
}

void TokenExchange::reverse_dispatch_filled_dx_slots(const RouterNormalization& router, cudaStream_t stream,
                                                     DxSlots slots) {
  launch_reverse_dispatch(world_, *kernels_, ExchangeInternals::filled_dx_slots_args(*this, router, slots), stream,
                          /*push_dx=*/false);
}

detail::ExchangeArgs ExchangeInternals::filled_dx_slots_args(const TokenExchange& exchange,
                                                            const RouterNormalization& router, DxSlots slots) {
  const ExchangeOptions& options = exchange.options();
  CARACAL_CHECK(options.backward,
                "TokenExchange::reverse_dispatch_filled_dx_slots needs ExchangeOptions::backward = true");
  CARACAL_CHECK(slots == DxSlots::kPerRoute || (options.expert_dx && options.ring_rows > 0),
                "TokenExchange::reverse_dispatch_filled_dx_slots: slots = DxSlots::kPerTokenRank needs a ring "
                "(ExchangeOptions::ring_rows > 0) with expert_dx = true (the fused backward's groups)");
  detail::ExchangeArgs args = exchange.kernels_->args;
  args.scaling = scaling_of(router);
  args.dx_group_rows = slots == DxSlots::kPerTokenRank && !options.rows_per_route ? options.ring_rows : -1;
  return args;
}

void TokenExchange::check() {
  world_.check();
  fault_.check();
}

}  // namespace caracal::transfer
