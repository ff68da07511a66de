#pragma once
// An expert-parallel world (DESIGN §4): `world_size` ranks, each owning a symmetric heap of the same
// size; buffers are allocated once at setup (the same calls in the same order on every rank) and
// named by SymmetricPtr. Kernels see the world through DeviceWorld (device_world.cuh) and are
// launched with caracal::comm::launch (launch.cuh). Backends: LoopbackWorld (loopback_world.hpp),
// every rank virtual, on one GPU, in one launch; NcclWorld (nccl_world.hpp), one rank per process
// or thread, NCCL symmetric memory. Used from one host thread at a time, whose current device is
// device().
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include <cuda_runtime.h>

#include "caracal/comm/cuda_memory.hpp"
#include "caracal/comm/device_error.hpp"
#include "caracal/comm/first_error.hpp"
#include "caracal/comm/heap_allocator.hpp"
#include "caracal/comm/symmetric_ptr.hpp"

namespace caracal::comm {

struct DeviceWorld;   // device_world.cuh (CUDA code only)
struct WorldControl;  // src/device/comm/world_control.hpp

// Which ranks this process drives, on which device.
struct WorldShape {
  const char* backend;   // for messages: "LoopbackWorld", "NcclWorld"
  int world_size;
  int first_local_rank;  // global rank of the first local rank
  int local_ranks;       // loopback: world_size; NCCL: 1
  int device;
};

// After construction nothing here synchronizes the device but reset(), which first waits for the
// work already on its stream: the other calls only touch host memory or enqueue work on a stream,
// so launches can be captured into CUDA graphs. What a captured launch reads at run time (the wait
// timeout, the reset generation, the fault-injection hook) lives in device memory that those calls
// update in stream order, so a graph captured before set_wait_timeout() or reset() follows them
// when replayed.
// Failures: every device wait is bounded by wait_timeout(). The first wait that expires aborts the
// world: every rank's waits end at once, every later launch (eager or replayed) stops at its first
// barrier, fault_flag() reads 1.0, and check() throws on every rank, and keeps throwing, until
// reset() has been called on every rank (collective). See device_sync.cuh.
class World {
 public:
  // Long enough for a rank that stalls on the host for a checkpoint, an eval or a first-step compile
  // (as NCCL's watchdog).
  static constexpr std::chrono::nanoseconds kDefaultWaitTimeout = std::chrono::minutes(10);

  // Not copyable or movable (kernels hold pointers into it); destroy it after its last launch.
  World(const World&) = delete;
  World& operator=(const World&) = delete;
  virtual ~World();

  int world_size() const { return shape_.world_size; }
  int first_local_rank() const { return shape_.first_local_rank; }
  int local_ranks() const { return shape_.local_ranks; }
  int device() const { return shape_.device; }
  int multiprocessors() const { return multiprocessors_; }

  // Allocates `count` elements of T in every rank's heap (256-byte aligned, zero-filled at setup).
  // Throws caracal::Error("symmetric heap: asked for X bytes, Y of Z left") when the heap is full.
  template <typename T>
  SymmetricPtr<T> allocate(size_t count) {
    return SymmetricPtr<T>{allocator_.allocate(count, sizeof(T))};
  }
  size_t heap_bytes_per_rank() const { return allocator_.capacity(); }
  size_t heap_bytes_left() const { return allocator_.left(); }

  // `ptr` in local rank `local_rank`'s heap, as a device pointer of this process (for host-side
  // copies and for kernels that do not take a DeviceWorld). It is the same address that
  // DeviceWorld::at gives for that rank, so both may be mixed.
  template <typename T>
  T* local_pointer(SymmetricPtr<T> ptr, int local_rank = 0) const {
    return reinterpret_cast<T*>(local_heap(local_rank) + ptr.offset);
  }
  char* local_heap(int local_rank) const;
  // The device array of every rank's heap base (DeviceWorld::heap), for a kernel that stores into
  // peers' heaps without a DeviceWorld (a GEMM epilogue pushing rows home). Valid while the world is.
  char* const* device_heap_table() const { return heap_table_.get(); }

  // The view passed to one launch of a backend-agnostic kernel whose grid is local_ranks() *
  // ctas_per_rank CTAs. Each call is a new launch: it gets the next launch id, under which
  // check() names `launch_name` (copied; a graph replay reports the ids and names of its
  // capture). Host only, no sync.
  DeviceWorld device_view(int ctas_per_rank, const char* launch_name);

  // How long a device wait may spin before it records an error (default kDefaultWaitTimeout), in
  // (0, 1 h]. Enqueued on `stream`: the launches after it in stream order use it, graph replays
  // included. Throws caracal::Error for a value out of range.
  void set_wait_timeout(std::chrono::nanoseconds timeout, cudaStream_t stream);
  // The latest value set (what launches enqueued from now on will use).
  std::chrono::nanoseconds wait_timeout() const { return std::chrono::nanoseconds(timeout_ns_); }

  // Throws caracal::Error describing the first device wait that failed (the wait, the rank, the
  // peer, the launch), and throws it again at every later call until reset(): the world is
  // faulted. Reads pinned host memory only: it does not wait for running kernels, so an error shows
  // up at the first check after it happened. faulted() says the same without throwing.
  void check();
  bool faulted();

  // Brings a faulted world back (collective: every rank calls it, on the stream of its launches).
  // After a failed wait the barrier state is inconsistent (some ranks advanced, some did not) and
  // the world is aborted. reset() first waits on the host for the work already on `stream` (the
  // failed launches end at their next wait, the world being aborted), so that every error they
  // record is in before the fault is cleared and none can take the place of a later one; then it
  // enqueues on `stream`, bracketed on the NCCL backend by two cross-rank rendezvous, the zeroing
  // of the barrier state (abort word and fault flag included), a new generation and the disarming
  // of stall_next_barrier, and clears the fault. Errors recorded by launches made before it are
  // ignored. Harmless on a healthy world. Throws caracal::Error while `stream` is capturing a graph.
  void reset(cudaStream_t stream);

  // Where the device reads whether the world is aborted: local rank `local_rank`'s abort word
  // (0: healthy; barrier_layout::kAbort). For kernels that must act on an abort without waiting
  // (the layer poisons its outputs with it).
  const uint32_t* abort_word(int local_rank) const;

  // Local rank `local_rank`'s fault flag, a float in device memory: 0.0 while the world is
  // healthy, 1.0 from the moment a wait of any rank expired (the world aborted: the passes running
  // then and after are poisoned) until reset() zeroes it in stream order. A training loop gates its
  // optimizer step on it without a host sync (a fused optimizer's found_inf). Valid while the world is.
  const float* fault_flag(int local_rank) const;

  // Fault injection for tests: enqueued on `stream`, arms a hook with which the CTAs of rank `rank`
  // (one of this process's) arrive `delay` late at that rank's next world barrier, as a rank
  // stalled on the host would, in whichever launch or graph replay it comes; the hook then disarms
  // itself (reset() disarms it too). A delay past the wait timeout times the barrier out.
  void stall_next_barrier(int rank, std::chrono::nanoseconds delay, cudaStream_t stream);

  // Checks at setup that every rank passed the same values (collective; synchronizes): throws
  // caracal::Error on every rank, naming `what`, the first field that differs, and the ranks' values.
  // Ranks built with different shapes would lay out their symmetric heaps differently and read
  // the wrong peer memory. `names` and `values` have the same length.
  void require_same_on_all_ranks(const char* what, const std::vector<const char*>& names,
                                 const std::vector<int64_t>& values);

 protected:
  World(const WorldShape& shape, size_t heap_bytes_per_rank);

  // Bytes each rank's heap occupies: the barrier state plus the user region, rounded to 256.
  size_t heap_stride() const { return heap_stride_; }
  // Records where every rank's heap is mapped in this process (setup only; synchronizes).
  void publish_heaps(const std::vector<char*>& heaps);
  // Cross-rank fence on `stream` used by reset: once it completes on a rank, every rank has
  // completed all work it enqueued before its own call. Loopback: stream order already does that.
  virtual void rendezvous(cudaStream_t stream) = 0;
  // Every rank's `values` (the same count on each), rank after rank (setup only; synchronizes).
  // Loopback: all ranks are this process's, so its own values stand for all of them.
  virtual std::vector<int64_t> all_gather(const std::vector<int64_t>& values) = 0;

 private:
  // Launch names beyond this many distinct ones are reported as "(unnamed)".
  static constexpr size_t kMaxLaunchNames = 4096;

  // Throws caracal::Error naming `what` unless the calling thread's current device is device().
  void require_current_device(const char* what) const;
  uint32_t intern_launch_name(const char* name);
  std::string launch_name(uint32_t name) const;
  // Takes a new error record of the current generation, if any, into fault_ (clears the record).
  void take_device_error();

  WorldShape shape_;
  SymmetricHeapAllocator allocator_;
  size_t heap_stride_;
  int multiprocessors_ = 0;
  uint64_t timeout_ns_;                        // the latest set_wait_timeout
  std::vector<char*> heaps_;                   // [world_size] as mapped in this process
  DeviceMemory<char*> heap_table_;             // device copy of heaps_
  DeviceMemory<WorldControl> control_;         // what launches read at run time (world_control.hpp)
  FirstErrorChannel<DeviceErrorRecord> errors_;  // failed waits (first error of a period)
  uint32_t next_launch_ = 0;
  std::vector<std::string> launch_names_;      // interned: DeviceWorld::launch_name indexes it
  std::unordered_map<std::string, uint32_t> launch_name_ids_;
  uint32_t generation_ = 0;  // reset() count (the device's WorldControl::generation, in stream order)
  std::string fault_;        // the error that faulted the world, until reset()
};

namespace detail {
// "" when all ranks hold the same value of every field, else "<name> differs (rank 0: a, rank 1:
// b, ...)" for the first field that does not. `all_values` is rank-major: [world_size][names.size()].
std::string first_mismatch(const std::vector<const char*>& names, const std::vector<int64_t>& all_values,
                           int world_size);
}  // namespace detail

}  // namespace caracal::comm
