#pragma once
// NCCL communicators and collectives.
//
// Communicators are created non-blocking (ncclConfig_t::blocking = 0) so that no NCCL call can hang
// a rank thread: every wait polls ncclCommGetAsyncError against a timeout and, on error or timeout,
// aborts the communicator (ncclCommAbort) and throws DeviceError. A rank that fails aborts its
// communicators; its peers then see an error or their own timeout instead of hanging. The executor
// aborts a rank's communicators from its watchdog thread when the rank thread is blocked in a device call
// after a failure (CudaDevice::abort, thread-safe).
//
// Creation (one process, one thread per GPU): one thread builds a UniqueIdTable for the layout
// (one ncclUniqueId per group instance), then every rank thread, with its device current, calls
// CommTable::create. With MPI later, rank 0 of each group broadcasts the same ids.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "threewalls/scenarios/layout.hpp"

namespace threewalls::backend {

using std::chrono::milliseconds;
inline constexpr milliseconds kDefaultNcclTimeout{std::chrono::minutes(5)};

class NcclComm {
 public:
  NcclComm() = default;
  // Takes ownership of `comm` (a member of `group_name` of `size` ranks, this rank at `index`).
  NcclComm(ncclComm_t comm, const char* group_name, int index, int size, milliseconds timeout);
  ~NcclComm();  // ncclCommDestroy, or nothing after abort()
  NcclComm(NcclComm&& o) noexcept;
  NcclComm& operator=(NcclComm&& o) noexcept;
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  [[nodiscard]] ncclComm_t get() const { return comm_; }
  [[nodiscard]] int index() const { return index_; }
  [[nodiscard]] int size() const { return size_; }
  [[nodiscard]] const char* group_name() const { return group_; }
  [[nodiscard]] bool aborted() const { return aborted_.load(); }
  // The communicator for an enqueue; throws DeviceError once it was aborted (by this thread or by the
  // executor's watchdog on another thread: a freed communicator must never reach NCCL).
  [[nodiscard]] ncclComm_t live() const;
  [[nodiscard]] milliseconds timeout() const { return timeout_; }

  // ncclCommAbort (idempotent, callable from another thread): frees the communicator without waiting
  // for peers; its kernels still in flight see the abort and end.
  void abort() noexcept;
  // Polls until no operation of this communicator is in progress (after a non-blocking init or an
  // enqueue that returned ncclInProgress). Aborts and throws DeviceError on error or timeout;
  // `what` names the operation in the message.
  void wait_ready(const char* what);
  // Polls until `stream` has finished, checking this communicator's asynchronous errors. Aborts and
  // throws DeviceError on error or timeout. For watchdogs and tests; the executor normally syncs with
  // events.
  void wait_stream(cudaStream_t stream, const char* what);
  // Checks the result of an NCCL enqueue call: ncclSuccess passes, ncclInProgress waits (wait_ready),
  // anything else aborts and throws naming `call`, file:line.
  void check(ncclResult_t result, const char* call, const char* file, int line);

 private:
  [[noreturn]] void fail(const std::string& why);
  ncclComm_t comm_ = nullptr;
  const char* group_ = "";
  int index_ = 0;
  int size_ = 0;
  milliseconds timeout_ = kDefaultNcclTimeout;
  std::atomic<bool> aborted_{false};
};

// One ncclUniqueId per instance of each group of a layout (keyed by the group and its first member).
class UniqueIdTable {
 public:
  // Calls ncclGetUniqueId once per group instance of `groups` over all ranks of `layout`.
  static UniqueIdTable create(const scenarios::Layout& layout, const std::vector<scenarios::Group>& groups);
  [[nodiscard]] const ncclUniqueId& id(scenarios::Group g, int first_member) const;
  void set(scenarios::Group g, int first_member, const ncclUniqueId& id);

 private:
  std::map<std::pair<scenarios::Group, int>, ncclUniqueId> ids_;
};

// The communicators of one rank, by group (what OpRunner uses for collective/send/recv ops).
class CommTable {
 public:
  CommTable() = default;
  // Creates this rank's communicator for each of `groups` (the current device must be the rank's
  // GPU). All inits are started non-blocking, then awaited, so ranks that list groups in different
  // orders cannot deadlock. Throws DeviceError (after aborting) on error or timeout.
  static CommTable create(const scenarios::Layout& layout, int rank, const UniqueIdTable& ids,
                          const std::vector<scenarios::Group>& groups, milliseconds timeout = kDefaultNcclTimeout);
  void add(scenarios::Group g, NcclComm comm);
  [[nodiscard]] bool has(scenarios::Group g) const;
  // Throws InputError naming the group when this rank has no communicator for it.
  [[nodiscard]] NcclComm& comm(scenarios::Group g);
  void abort_all() noexcept;
  // Appends a pointer to each of its communicators (for abort_together).
  void collect(std::vector<NcclComm*>& out);

 private:
  std::map<scenarios::Group, NcclComm> comms_;
};

// Aborts every communicator of `comms` at once, one thread each, and returns when all are aborted.
// All the communicators of one GPU must go together: ncclCommAbort frees pinned host memory, and
// cuMemFreeHost waits for the device to be idle, which it is not while another communicator's kernel
// still waits for a peer that is gone (aborted one by one, the first abort never returns).
void abort_together(const std::vector<NcclComm*>& comms) noexcept;

// ---- collectives (bf16 data unless a type is given; counts in elements) ----
// All enqueue on `stream` and return; failures throw DeviceError after aborting the communicator.
// Bus-bandwidth factors (nccl-tests) are in docs/backend.md.
void all_reduce(const void* send, void* recv, std::size_t count, NcclComm& comm, cudaStream_t stream,
                ncclDataType_t type = ncclBfloat16);
void all_gather(const void* send, void* recv, std::size_t send_count, NcclComm& comm, cudaStream_t stream,
                ncclDataType_t type = ncclBfloat16);
void reduce_scatter(const void* send, void* recv, std::size_t recv_count, NcclComm& comm, cudaStream_t stream,
                    ncclDataType_t type = ncclBfloat16);
void broadcast(const void* send, void* recv, std::size_t count, int root, NcclComm& comm, cudaStream_t stream,
               ncclDataType_t type = ncclBfloat16);
// Equal split: `count_per_peer` elements to and from every member (own share included), as grouped
// ncclSend/ncclRecv.
void all_to_all(const void* send, void* recv, std::size_t count_per_peer, NcclComm& comm, cudaStream_t stream,
                ncclDataType_t type = ncclBfloat16);
// Unequal split: send_counts[p] elements from send + send_displs[p] to member p; recv_counts[p] into
// recv + recv_displs[p] from member p. Zero counts post nothing.
void all_to_all_v(const void* send, const std::vector<std::size_t>& send_counts,
                  const std::vector<std::size_t>& send_displs, void* recv, const std::vector<std::size_t>& recv_counts,
                  const std::vector<std::size_t>& recv_displs, NcclComm& comm, cudaStream_t stream,
                  ncclDataType_t type = ncclBfloat16);
// Point-to-point with group member `peer`.
void send(const void* buf, std::size_t count, int peer, NcclComm& comm, cudaStream_t stream,
          ncclDataType_t type = ncclBfloat16);
void recv(void* buf, std::size_t count, int peer, NcclComm& comm, cudaStream_t stream,
          ncclDataType_t type = ncclBfloat16);

// "2.28.9" of the loaded library.
[[nodiscard]] std::string nccl_version();

}  // namespace threewalls::backend
