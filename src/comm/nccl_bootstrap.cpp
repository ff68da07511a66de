#include "caracal/comm/nccl_bootstrap.hpp"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>

#include <cuda_runtime.h>
#include <unistd.h>

#include "caracal/comm/cuda_check.hpp"
#include "caracal/comm/nccl_check.hpp"
#include "caracal/error.hpp"

namespace caracal::comm {
namespace {

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// The integer value of environment variable `name`, or `fallback` when it is unset.
int env_int(const char* name, std::optional<int> fallback = std::nullopt) {
  const char* text = std::getenv(name);
  if (text == nullptr || text[0] == '\0') {
    CARACAL_CHECK(fallback.has_value(), "environment variable ", name, " is not set (the launcher sets it)");
    return *fallback;
  }
  char* end = nullptr;
  errno = 0;
  const long value = std::strtol(text, &end, 10);
  CARACAL_CHECK(errno == 0 && *end == '\0' && value >= 0 && value <= 1 << 20, "environment variable ", name, "='",
                text, "' is not a non-negative integer");
  return static_cast<int>(value);
}

std::string trimmed(const std::string& s) {
  const size_t first = s.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return "";
  return s.substr(first, s.find_last_not_of(" \t\r\n") - first + 1);
}

}  // namespace

NcclComm& NcclComm::operator=(NcclComm&& other) noexcept {
  if (this != &other) {
    if (comm_ != nullptr) (void)ncclCommDestroy(comm_);
    comm_ = other.comm_;
    other.comm_ = nullptr;
  }
  return *this;
}

NcclComm::~NcclComm() {
  if (comm_ != nullptr) (void)ncclCommDestroy(comm_);
}

std::string unique_id_to_hex(const ncclUniqueId& id) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(2 * sizeof(id.internal));
  for (const char c : id.internal) {
    const auto byte = static_cast<unsigned char>(c);
    hex += kDigits[byte >> 4];
    hex += kDigits[byte & 15];
  }
  return hex;
}

ncclUniqueId unique_id_from_hex(std::string_view hex) {
  ncclUniqueId id{};
  CARACAL_CHECK(hex.size() == 2 * sizeof(id.internal), "NCCL unique id: expected ", 2 * sizeof(id.internal),
                " hex digits, got ", hex.size());
  for (size_t i = 0; i < sizeof(id.internal); ++i) {
    const int high = hex_digit(hex[2 * i]);
    const int low = hex_digit(hex[2 * i + 1]);
    CARACAL_CHECK(high >= 0 && low >= 0, "NCCL unique id: '", hex.substr(2 * i, 2), "' at position ", 2 * i,
                  " is not hex");
    id.internal[i] = static_cast<char>(high << 4 | low);
  }
  return id;
}

ncclUniqueId new_unique_id() {
  require_nccl_environment();
  ncclUniqueId id{};
  check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  return id;
}

void write_unique_id_file(const std::string& path, const ncclUniqueId& id) {
  const std::string temporary = path + ".tmp." + std::to_string(getpid());
  {
    std::ofstream out(temporary, std::ios::trunc);
    out << unique_id_to_hex(id) << '\n';
    out.flush();
    CARACAL_CHECK(out.good(), "NCCL unique id: cannot write '", temporary, "'");
  }
  std::error_code error;
  std::filesystem::rename(temporary, path, error);
  CARACAL_CHECK(!error, "NCCL unique id: cannot rename '", temporary, "' to '", path, "': ", error.message());
}

ncclUniqueId read_unique_id_file(const std::string& path, std::chrono::milliseconds wait) {
  const auto deadline = std::chrono::steady_clock::now() + wait;
  for (;;) {
    std::ifstream in(path);
    if (in) {
      std::stringstream text;
      text << in.rdbuf();
      return unique_id_from_hex(trimmed(text.str()));
    }
    CARACAL_CHECK(std::chrono::steady_clock::now() < deadline, "NCCL unique id: file '", path, "' did not appear within ",
                  wait.count(), " ms (rank 0 or the launcher writes it)");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

ProcessRank process_rank_from_env() {
  ProcessRank p{};
  p.world_size = env_int("WORLD_SIZE");
  p.rank = env_int("RANK");
  p.device = env_int("LOCAL_RANK", p.rank);
  CARACAL_CHECK(p.world_size >= 1, "environment variable WORLD_SIZE must be at least 1, got ", p.world_size);
  CARACAL_CHECK(p.rank < p.world_size, "environment variable RANK=", p.rank, " is not below WORLD_SIZE=",
                p.world_size);
  return p;
}

ncclUniqueId unique_id_from_env(int rank) {
  if (const char* hex = std::getenv(kUniqueIdEnv); hex != nullptr && hex[0] != '\0') {
    return unique_id_from_hex(trimmed(hex));
  }
  const char* path = std::getenv(kUniqueIdFileEnv);
  CARACAL_CHECK(path != nullptr && path[0] != '\0', "NCCL unique id: set ", kUniqueIdEnv, " (hex) or ",
                kUniqueIdFileEnv, " (a fresh file path shared by all ranks)");
  if (rank == 0 && !std::filesystem::exists(path)) write_unique_id_file(path, new_unique_id());
  return read_unique_id_file(path, kUniqueIdFileWait);
}

void require_nccl_environment() {
  const char* nvls = std::getenv("NCCL_NVLS_ENABLE");
  CARACAL_CHECK(nvls != nullptr && std::string_view(nvls) == "0",
                "NVLink multicast must stay off: set NCCL_NVLS_ENABLE=0 in the environment before the process "
                "starts (NCCL reads it once, when the process's first communicator is made, torch.distributed's "
                "included); Caracal never sets it. It is ", nvls != nullptr ? "\"" + std::string(nvls) + "\"" : std::string("unset"));
  static std::once_flag once;
  std::call_once(once, [] {
    // Symmetric windows need NCCL's cuMem allocator; some machines (VMs among them) have it off by
    // default, and NCCL then refuses ncclDevCommCreate. A value the user set is kept.
    setenv("NCCL_CUMEM_ENABLE", "1", 0);
  });
}

NcclComm init_rank(const ncclUniqueId& id, int rank, int world_size, int device) {
  CARACAL_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, "init_rank: rank ", rank,
                " is not in [0, world_size = ", world_size, ")");
  require_nccl_environment();
  check_cuda(cudaSetDevice(device), "cudaSetDevice");
  ncclComm_t comm = nullptr;
  check_nccl(ncclCommInitRank(&comm, world_size, id, rank), "ncclCommInitRank");
  return NcclComm(comm);
}

NcclComm init_process_from_env() {
  const ProcessRank p = process_rank_from_env();
  return init_rank(unique_id_from_env(p.rank), p.rank, p.world_size, p.device);
}

std::vector<NcclComm> init_all(const std::vector<int>& devices) {
  CARACAL_CHECK(!devices.empty(), "init_all: no devices given");
  require_nccl_environment();
  std::vector<ncclComm_t> raw(devices.size(), nullptr);
  check_nccl(ncclCommInitAll(raw.data(), static_cast<int>(devices.size()), devices.data()), "ncclCommInitAll");
  std::vector<NcclComm> comms;
  comms.reserve(raw.size());
  for (ncclComm_t c : raw) comms.emplace_back(c);
  return comms;
}

}  // namespace caracal::comm
