// The backend-independent half of World: heap bookkeeping, launch views, the device error record.
#include "caracal/comm/world.hpp"

#include <atomic>
#include <climits>

#include "caracal/comm/cuda_check.hpp"
#include "caracal/comm/first_error.hpp"
#include "caracal/error.hpp"
#include "device/comm/barrier_layout.hpp"
#include "device/comm/device_world.cuh"
#include "comm/launch.cuh"
#include "device/comm/world_control.hpp"

namespace caracal::comm {
namespace {

constexpr int kMaxWorldSize = 1024;
constexpr size_t kMaxHeapBytes = size_t(1) << 40;  // 1 TiB per rank: beyond any GPU
constexpr std::chrono::nanoseconds kMaxWaitTimeout = std::chrono::hours(1);

size_t round_up(size_t value, size_t multiple) { return (value + multiple - 1) / multiple * multiple; }

const WorldShape& validated(const WorldShape& s, size_t heap_bytes_per_rank) {
  CARACAL_CHECK(s.world_size >= 1, s.backend, ": world_size must be at least 1, got ", s.world_size);
  CARACAL_CHECK(s.world_size <= kMaxWorldSize, s.backend, ": world_size must be at most ", kMaxWorldSize,
                ", got ", s.world_size);
  CARACAL_CHECK(s.local_ranks >= 1 && s.first_local_rank >= 0 && s.first_local_rank + s.local_ranks <= s.world_size,
                s.backend, ": local ranks [", s.first_local_rank, ", ", s.first_local_rank + s.local_ranks,
                ") are not within world_size ", s.world_size);
  CARACAL_CHECK(s.device >= 0, s.backend, ": device must be >= 0, got ", s.device);
  CARACAL_CHECK(heap_bytes_per_rank <= kMaxHeapBytes, s.backend, ": heap_bytes_per_rank ", heap_bytes_per_rank,
                " exceeds the limit of ", kMaxHeapBytes, " bytes");
  return s;
}

// Makes the world's device current first: what the members allocate (the error channel's device
// word) must live on it.
const WorldShape& made_current(const WorldShape& s) {
  check_cuda(cudaSetDevice(s.device), "cudaSetDevice");
  return s;
}

// The stream-ordered writes of WorldControl's fields (one thread each).
__global__ void set_control_timeout(WorldControl* control, uint64_t timeout_ns) { control->timeout_ns = timeout_ns; }

__global__ void start_control_generation(WorldControl* control, uint32_t generation) {
  control->generation = generation;
  control->stall_rank = -1;
  control->stall_ns = 0;
}

__global__ void arm_control_stall(WorldControl* control, int32_t rank, uint64_t stall_ns) {
  control->stall_ns = stall_ns;
  control->stall_rank = rank;
}

}  // namespace

World::World(const WorldShape& shape, size_t heap_bytes_per_rank)
    : shape_(made_current(validated(shape, heap_bytes_per_rank))),
      allocator_(barrier_layout::bytes(shape.world_size), round_up(heap_bytes_per_rank, SymmetricHeapAllocator::kAlignment)),
      heap_stride_(barrier_layout::bytes(shape.world_size) + allocator_.capacity()),
      timeout_ns_(static_cast<uint64_t>(kDefaultWaitTimeout.count())),
      errors_("device error") {
  int cooperative = 0;
  check_cuda(cudaDeviceGetAttribute(&cooperative, cudaDevAttrCooperativeLaunch, shape_.device),
             "cudaDeviceGetAttribute(cudaDevAttrCooperativeLaunch)");
  CARACAL_CHECK(cooperative != 0, shape_.backend, ": device ", shape_.device,
                " does not support cooperative launches, which world barriers need");
  check_cuda(cudaDeviceGetAttribute(&multiprocessors_, cudaDevAttrMultiProcessorCount, shape_.device),
             "cudaDeviceGetAttribute(cudaDevAttrMultiProcessorCount)");

  heap_table_ = device_alloc<char*>(static_cast<size_t>(shape_.world_size), "cudaMalloc(heap table)");
  control_ = device_alloc<WorldControl>(1, "cudaMalloc(world control)");
  WorldControl control;
  control.timeout_ns = timeout_ns_;
  check_cuda(cudaMemcpy(control_.get(), &control, sizeof(control), cudaMemcpyHostToDevice), "cudaMemcpy(world control)");
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize(world setup)");
}

World::~World() = default;

char* World::local_heap(int local_rank) const {
  CARACAL_CHECK(local_rank >= 0 && local_rank < shape_.local_ranks, shape_.backend, ": local rank ", local_rank,
                " out of range [0, ", shape_.local_ranks, ")");
  return heaps_[static_cast<size_t>(shape_.first_local_rank + local_rank)];
}

void World::publish_heaps(const std::vector<char*>& heaps) {
  CARACAL_CHECK(heaps.size() == static_cast<size_t>(shape_.world_size), shape_.backend, ": ", heaps.size(),
                " heaps for a world of ", shape_.world_size);
  heaps_ = heaps;
  check_cuda(cudaMemcpy(heap_table_.get(), heaps_.data(), heaps_.size() * sizeof(char*), cudaMemcpyHostToDevice),
             "cudaMemcpy(heap table)");
}

DeviceWorld World::device_view(int ctas_per_rank, const char* launch_name) {
  CARACAL_CHECK(ctas_per_rank >= 1 && ctas_per_rank <= INT_MAX / shape_.local_ranks, shape_.backend,
                ": ctas_per_rank must be in [1, ", INT_MAX / shape_.local_ranks, "], got ", ctas_per_rank);
  require_current_device("device_view");
  DeviceWorld view;
  view.world_size = shape_.world_size;
  view.first_local_rank = shape_.first_local_rank;
  view.local_ranks = shape_.local_ranks;
  view.ctas_per_rank = ctas_per_rank;
  view.heap = heap_table_.get();
  view.error = errors_.device_record();
  view.error_claim = errors_.device_claim();
  view.control = control_.get();
  view.launch_id = next_launch_++;
  view.launch_name = intern_launch_name(launch_name);
  return view;
}

void World::require_current_device(const char* what) const {
  int current = -1;
  check_cuda(cudaGetDevice(&current), "cudaGetDevice");
  CARACAL_CHECK(current == shape_.device, shape_.backend, "::", what, ": the world is on device ", shape_.device,
                " but the calling thread's current device is ", current);
}

uint32_t World::intern_launch_name(const char* name) {
  const std::string key = name != nullptr ? name : "";
  if (const auto found = launch_name_ids_.find(key); found != launch_name_ids_.end()) return found->second;
  if (launch_names_.size() == kMaxLaunchNames) return static_cast<uint32_t>(kMaxLaunchNames);
  const auto id = static_cast<uint32_t>(launch_names_.size());
  launch_names_.push_back(key);
  launch_name_ids_.emplace(key, id);
  return id;
}

std::string World::launch_name(uint32_t name) const {
  return name < launch_names_.size() ? launch_names_[name] : "(unnamed)";
}

void World::set_wait_timeout(std::chrono::nanoseconds timeout, cudaStream_t stream) {
  CARACAL_CHECK(timeout.count() > 0 && timeout <= kMaxWaitTimeout, shape_.backend,
                ": wait timeout must be in (0, 1 h], got ", timeout.count(), " ns");
  require_current_device("set_wait_timeout");
  set_control_timeout<<<1, 1, 0, stream>>>(control_.get(), static_cast<uint64_t>(timeout.count()));
  check_cuda(cudaGetLastError(), "World::set_wait_timeout");
  timeout_ns_ = static_cast<uint64_t>(timeout.count());
}

void World::take_device_error() {
  DeviceErrorRecord error{};
  if (!errors_.take(error)) return;
  // Work ordered before the last reset() on another stream than reset's may still fail after it:
  // its error belongs to the fault that reset cleared.
  if (error.generation != generation_) return;
  if (fault_.empty()) fault_ = describe_device_error(error, launch_name(error.launch_name));
}

bool World::faulted() {
  take_device_error();
  return !fault_.empty();
}

void World::check() {
  if (faulted()) throw Error(fault_);
}

void World::reset(cudaStream_t stream) {
  require_current_device("reset");
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  check_cuda(cudaStreamIsCapturing(stream, &capture), "cudaStreamIsCapturing(World::reset)");
  CARACAL_CHECK(capture == cudaStreamCaptureStatusNone, shape_.backend,
                ": reset() cannot be captured into a CUDA graph (it waits for the failed launches on the host); "
                "call it outside the capture");
  // Drain: the failed launches on this stream end (their waits see the abort) and have recorded
  // what they will ever record, so no late record of theirs can hold the channel when a launch
  // after this reset fails.
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize(World::reset)");
  take_device_error();
  rendezvous(stream);  // every rank's failed launch is over: no stale announcement is in flight
  for (int l = 0; l < shape_.local_ranks; ++l) {
    check_cuda(cudaMemsetAsync(local_heap(l), 0, barrier_layout::bytes(shape_.world_size), stream),
               "cudaMemsetAsync(barrier state)");
  }
  ++generation_;
  start_control_generation<<<1, 1, 0, stream>>>(control_.get(), generation_);
  check_cuda(cudaGetLastError(), "World::reset");
  rendezvous(stream);  // every rank has zeroed its state before any rank's next barrier writes to it
  fault_.clear();
}

const uint32_t* World::abort_word(int local_rank) const {
  return reinterpret_cast<const uint32_t*>(local_heap(local_rank)) + barrier_layout::kAbort;
}

const float* World::fault_flag(int local_rank) const {
  return reinterpret_cast<const float*>(local_heap(local_rank)) + barrier_layout::kFault;
}

void World::stall_next_barrier(int rank, std::chrono::nanoseconds delay, cudaStream_t stream) {
  CARACAL_CHECK(rank >= shape_.first_local_rank && rank < shape_.first_local_rank + shape_.local_ranks,
                shape_.backend, ": stall_next_barrier: rank ", rank, " is not one of this process's ranks [",
                shape_.first_local_rank, ", ", shape_.first_local_rank + shape_.local_ranks, ")");
  CARACAL_CHECK(delay.count() >= 0 && delay <= kMaxWaitTimeout, shape_.backend,
                ": stall_next_barrier: delay must be in [0, 1 h], got ", delay.count(), " ns");
  require_current_device("stall_next_barrier");
  arm_control_stall<<<1, 1, 0, stream>>>(control_.get(), rank, static_cast<uint64_t>(delay.count()));
  check_cuda(cudaGetLastError(), "World::stall_next_barrier");
}

void World::require_same_on_all_ranks(const char* what, const std::vector<const char*>& names,
                                      const std::vector<int64_t>& values) {
  CARACAL_CHECK(names.size() == values.size(), what, ": ", names.size(), " names for ", values.size(), " values");
  const std::vector<int64_t> all = all_gather(values);
  const std::string mismatch = detail::first_mismatch(names, all, shape_.world_size);
  CARACAL_CHECK(mismatch.empty(), what, ": the ranks of this world were built differently (every rank must "
                "pass the same configuration, or their symmetric heaps would not line up): ", mismatch);
}

namespace detail {

std::string first_mismatch(const std::vector<const char*>& names, const std::vector<int64_t>& all_values,
                           int world_size) {
  const size_t fields = names.size();
  CARACAL_CHECK(all_values.size() == fields * static_cast<size_t>(world_size), "first_mismatch: ",
                all_values.size(), " values for ", world_size, " ranks of ", fields, " fields");
  for (size_t f = 0; f < fields; ++f) {
    for (int r = 1; r < world_size; ++r) {
      const int64_t here = all_values[static_cast<size_t>(r) * fields + f];
      if (here == all_values[f]) continue;
      std::string values;
      for (int q = 0; q < world_size; ++q) {
        values += caracal::detail::concat(q == 0 ? "" : ", ", "rank ", q, ": ",
                                          all_values[static_cast<size_t>(q) * fields + f]);
      }
      return caracal::detail::concat(names[f], " differs (", values, ")");
    }
  }
  return "";
}

void throw_not_coresident(const World& world, const char* name, const LaunchShape& shape, int ctas_per_sm) {
  const long long most = static_cast<long long>(ctas_per_sm) * world.multiprocessors();
  throw Error(caracal::detail::concat(
      "launch '", name, "': ", static_cast<long long>(world.local_ranks()) * shape.ctas_per_rank, " CTAs (",
      world.local_ranks(), " local ranks x ", shape.ctas_per_rank, " CTAs per rank, ", shape.threads_per_cta,
      " threads and ", shape.shared_bytes, " bytes of dynamic shared memory each) cannot all be resident at once on device ",
      world.device(), ", which holds at most ", ctas_per_sm, " per SM x ", world.multiprocessors(), " SMs = ", most,
      "; world barriers need every CTA resident, so use at most ", most / world.local_ranks(),
      " CTAs per rank (max_ctas_per_rank)"));
}

}  // namespace detail
}  // namespace caracal::comm
