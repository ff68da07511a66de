#pragma once
// Creating the NCCL communicators an NcclWorld is built on (DESIGN §4), in the two ways Caracal
// runs:
//   * one process per GPU (torchrun, mpirun, ...): init_process_from_env() reads the rank from
//     RANK / WORLD_SIZE / LOCAL_RANK and the NCCL unique id from the launcher, either as hex in
//     CARACAL_NCCL_ID or through a file named by CARACAL_NCCL_ID_FILE (rank 0 writes it if it does
//     not exist yet, the others wait for it; give every job a fresh path);
//   * one thread per GPU in one process (the tools): init_all(devices), then each GPU's thread
//     builds its NcclWorld concurrently (the construction is collective).
// Every helper refuses to make a communicator unless NVLink multicast is off for the whole process
// (NCCL_NVLS_ENABLE=0 in the environment, set by whoever starts it: Caracal never sets it).
#include <chrono>
#include <string>
#include <string_view>
#include <vector>

#include <nccl.h>

namespace caracal::comm {

// Owns one communicator (ncclCommDestroy when destroyed). Move-only.
class NcclComm {
 public:
  NcclComm() = default;
  explicit NcclComm(ncclComm_t comm) : comm_(comm) {}
  NcclComm(NcclComm&& other) noexcept : comm_(other.comm_) { other.comm_ = nullptr; }
  NcclComm& operator=(NcclComm&& other) noexcept;
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;
  ~NcclComm();

  ncclComm_t get() const { return comm_; }

 private:
  ncclComm_t comm_ = nullptr;
};

// The variables the process-per-GPU bootstrap reads.
inline constexpr const char* kUniqueIdEnv = "CARACAL_NCCL_ID";            // the id as hex
inline constexpr const char* kUniqueIdFileEnv = "CARACAL_NCCL_ID_FILE";   // path of a file holding it
inline constexpr std::chrono::seconds kUniqueIdFileWait{120};           // how long ranks > 0 wait for it

// The id as 2 * NCCL_UNIQUE_ID_BYTES lowercase hex digits, and back (throws caracal::Error on
// a wrong length or a non-hex digit).
std::string unique_id_to_hex(const ncclUniqueId& id);
ncclUniqueId unique_id_from_hex(std::string_view hex);

// ncclGetUniqueId (to be called on one rank, then passed to all).
ncclUniqueId new_unique_id();

// Writes the id as hex to `path` atomically (a temporary file renamed into place), so a reader
// sees either no file or the whole id.
void write_unique_id_file(const std::string& path, const ncclUniqueId& id);
// Reads the id from `path`, waiting up to `wait` for the file to appear; throws caracal::Error
// naming the path after that.
ncclUniqueId read_unique_id_file(const std::string& path, std::chrono::milliseconds wait);

// This process's place in a one-process-per-GPU job.
struct ProcessRank {
  int rank;        // RANK
  int world_size;  // WORLD_SIZE
  int device;      // LOCAL_RANK, or RANK when LOCAL_RANK is unset (a single node)
};
// Reads RANK, WORLD_SIZE and LOCAL_RANK; throws caracal::Error naming the variable when one is
// missing, not an integer, or out of range.
ProcessRank process_rank_from_env();
// The unique id from CARACAL_NCCL_ID (hex), or else from the file CARACAL_NCCL_ID_FILE names:
// rank 0 creates and writes it if it does not exist, other ranks wait for it.
ncclUniqueId unique_id_from_env(int rank);

// Throws caracal::Error unless NCCL_NVLS_ENABLE is "0" (never NVLink multicast; NCCL reads it once
// per process, when its first communicator is made, so only the environment the process started
// with can be trusted), then sets NCCL_CUMEM_ENABLE=1 unless already set (symmetric memory needs it).
void require_nccl_environment();

// One rank of a communicator on `device` (made current on the calling thread): for one process
// per GPU, or one thread per GPU where each thread calls it with the same id.
NcclComm init_rank(const ncclUniqueId& id, int rank, int world_size, int device);
// process_rank_from_env + unique_id_from_env + init_rank.
NcclComm init_process_from_env();
// One communicator per device, made together from one thread (ncclCommInitAll): rank i on
// devices[i].
std::vector<NcclComm> init_all(const std::vector<int>& devices);

}  // namespace caracal::comm
