#include "threewalls/backend/nccl.hpp"

#include <algorithm>
#include <string>
#include <thread>

#include "threewalls/backend/error.hpp"

namespace threewalls::backend {
namespace {

using Clock = std::chrono::steady_clock;

std::string seconds_text(milliseconds ms) {
  return std::to_string(static_cast<double>(ms.count()) / 1000.0) + " s";
}

void ensure_ncclsuccess(ncclResult_t r, const char* call) {
  if (r != ncclSuccess) detail::throw_nccl(r, call, __FILE__, __LINE__, nullptr);
}

}  // namespace

std::string nccl_version() {
  int v = 0;
  ensure_ncclsuccess(ncclGetVersion(&v), "ncclGetVersion(&v)");
  // NCCL >= 2.9 encodes major*10000 + minor*100 + patch.
  return std::to_string(v / 10000) + "." + std::to_string((v / 100) % 100) + "." + std::to_string(v % 100);
}

// ---- NcclComm ----
NcclComm::NcclComm(ncclComm_t comm, const char* group_name, int index, int size, milliseconds timeout)
    : comm_(comm), group_(group_name), index_(index), size_(size), timeout_(timeout) {}

NcclComm::~NcclComm() {
  if (comm_ != nullptr && !aborted_) {
    // Destroy waits for nothing of ours (the executor synchronised its streams); if the comm is
    // in an error state, abort instead so that destruction cannot block.
    ncclResult_t state = ncclSuccess;
    if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess || state != ncclSuccess) {
      static_cast<void>(ncclCommAbort(comm_));
    } else {
      static_cast<void>(ncclCommDestroy(comm_));
    }
  }
}

NcclComm::NcclComm(NcclComm&& o) noexcept
    : comm_(std::exchange(o.comm_, nullptr)), group_(o.group_), index_(o.index_), size_(o.size_), timeout_(o.timeout_),
      aborted_(o.aborted_.load()) {}

NcclComm& NcclComm::operator=(NcclComm&& o) noexcept {
  if (this != &o) {
    NcclComm old(std::move(*this));  // destroyed at the end of this scope
    comm_ = std::exchange(o.comm_, nullptr);
    group_ = o.group_;
    index_ = o.index_;
    size_ = o.size_;
    timeout_ = o.timeout_;
    aborted_.store(o.aborted_.load());
  }
  return *this;
}

void NcclComm::abort() noexcept {
  if (comm_ != nullptr && !aborted_.exchange(true)) static_cast<void>(ncclCommAbort(comm_));
}

ncclComm_t NcclComm::live() const {
  if (aborted_.load()) {
    throw DeviceError(rank_prefix() + "NCCL communicator of group " + group_ + " (member " + std::to_string(index_) +
                      " of " + std::to_string(size_) + "): aborted (the run is stopping); nothing more is enqueued");
  }
  return comm_;
}

void NcclComm::fail(const std::string& why) {
  const std::string who = rank_prefix() + "NCCL communicator of group " + group_ + " (member " +
                          std::to_string(index_) + " of " + std::to_string(size_) + "): ";
  abort();
  throw DeviceError(who + why + "; communicator aborted");
}

void NcclComm::wait_ready(const char* what) {
  if (aborted_) fail(std::string(what) + ": the communicator was aborted earlier");
  const auto start = Clock::now();
  for (;;) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
    if (r != ncclSuccess) fail(std::string(what) + ": ncclCommGetAsyncError failed: " + ncclGetErrorString(r));
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) {
      const char* last = ncclGetLastError(comm_);
      fail(std::string(what) + ": " + ncclGetErrorString(state) + (last != nullptr && *last != '\0' ? std::string(" (") + last + ")" : std::string()));
    }
    if (Clock::now() - start > timeout_) fail(std::string(what) + ": timed out after " + seconds_text(timeout_));
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

void NcclComm::wait_stream(cudaStream_t stream, const char* what) {
  const auto start = Clock::now();
  for (;;) {
    const cudaError_t q = cudaStreamQuery(stream);
    if (q == cudaSuccess) return;
    if (q != cudaErrorNotReady) {
      fail(std::string(what) + ": stream error " + cudaGetErrorName(q) + ": " + cudaGetErrorString(q));
    }
    ncclResult_t state = ncclSuccess;
    if (ncclCommGetAsyncError(comm_, &state) == ncclSuccess && state != ncclSuccess && state != ncclInProgress) {
      fail(std::string(what) + ": " + ncclGetErrorString(state));
    }
    if (Clock::now() - start > timeout_) fail(std::string(what) + ": timed out after " + seconds_text(timeout_));
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

void NcclComm::check(ncclResult_t result, const char* call, const char* file, int line) {
  if (result == ncclSuccess) return;
  if (result == ncclInProgress) {
    wait_ready(call);
    return;
  }
  const char* last = ncclGetLastError(comm_);
  std::string f(file);
  const auto pos = f.rfind("/backend/");
  if (pos != std::string::npos) f = f.substr(pos + 1);
  fail(std::string(call) + " failed at " + f + ":" + std::to_string(line) + ": " + ncclGetErrorString(result) +
       (last != nullptr && *last != '\0' ? std::string(" (") + last + ")" : std::string()));
}

#define TW_NCCL_ENQUEUE(comm, call) (comm).check((call), #call, __FILE__, __LINE__)

// ---- UniqueIdTable ----
UniqueIdTable UniqueIdTable::create(const scenarios::Layout& layout, const std::vector<scenarios::Group>& groups) {
  UniqueIdTable t;
  for (const scenarios::Group g : groups) {
    if (g == scenarios::Group::none) continue;
    for (int r = 0; r < layout.world(); ++r) {
      const std::vector<int> members = layout.group_members(g, r);
      if (members.empty()) continue;
      const auto key = std::make_pair(g, members.front());
      if (t.ids_.count(key) != 0) continue;
      ncclUniqueId id{};
      ensure_ncclsuccess(ncclGetUniqueId(&id), "ncclGetUniqueId(&id)");
      t.ids_.emplace(key, id);
    }
  }
  return t;
}

const ncclUniqueId& UniqueIdTable::id(scenarios::Group g, int first_member) const {
  const auto it = ids_.find(std::make_pair(g, first_member));
  if (it == ids_.end()) {
    throw InputError(rank_prefix() + "no ncclUniqueId for group " + scenarios::to_string(g) + " starting at rank " +
                     std::to_string(first_member) + " (UniqueIdTable::create was not given this group)");
  }
  return it->second;
}

void UniqueIdTable::set(scenarios::Group g, int first_member, const ncclUniqueId& id) {
  ids_[std::make_pair(g, first_member)] = id;
}

// ---- CommTable ----
CommTable CommTable::create(const scenarios::Layout& layout, int rank, const UniqueIdTable& ids,
                            const std::vector<scenarios::Group>& groups, milliseconds timeout) {
  CommTable table;
  std::vector<scenarios::Group> todo = groups;
  std::sort(todo.begin(), todo.end());
  todo.erase(std::unique(todo.begin(), todo.end()), todo.end());
  for (const scenarios::Group g : todo) {
    if (g == scenarios::Group::none) continue;
    const std::vector<int> members = layout.group_members(g, rank);
    const int index = layout.group_index(g, rank);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t c = nullptr;
    const ncclResult_t r = ncclCommInitRankConfig(&c, static_cast<int>(members.size()), ids.id(g, members.front()),
                                                  index, &config);
    NcclComm comm(c, scenarios::to_string(g), index, static_cast<int>(members.size()), timeout);
    if (r != ncclSuccess && r != ncclInProgress) {
      table.abort_all();
      comm.check(r, "ncclCommInitRankConfig", __FILE__, __LINE__);  // throws
    }
    table.comms_.emplace(g, std::move(comm));
  }
  try {
    for (auto& [g, comm] : table.comms_) comm.wait_ready("ncclCommInitRankConfig");
  } catch (...) {
    table.abort_all();
    throw;
  }
  return table;
}

void CommTable::add(scenarios::Group g, NcclComm comm) { comms_[g] = std::move(comm); }
bool CommTable::has(scenarios::Group g) const { return comms_.count(g) != 0; }
NcclComm& CommTable::comm(scenarios::Group g) {
  const auto it = comms_.find(g);
  if (it == comms_.end()) {
    throw InputError(rank_prefix() + "no NCCL communicator for group " + scenarios::to_string(g) +
                     " in this rank's CommTable");
  }
  return it->second;
}
void CommTable::abort_all() noexcept {
  std::vector<NcclComm*> all;
  try {
    collect(all);
  } catch (...) {  // NOLINT(bugprone-empty-catch): out of memory for a few pointers: abort one by one
    for (auto& [g, comm] : comms_) comm.abort();
    return;
  }
  abort_together(all);
}
void CommTable::collect(std::vector<NcclComm*>& out) {
  for (auto& [g, comm] : comms_) out.push_back(&comm);
}

void abort_together(const std::vector<NcclComm*>& comms) noexcept {
  if (comms.size() == 1) {
    comms.front()->abort();
    return;
  }
  std::vector<std::thread> threads;
  try {
    threads.reserve(comms.size());
    for (NcclComm* c : comms) threads.emplace_back([c] { c->abort(); });
  } catch (...) {                          // NOLINT(bugprone-empty-catch): no thread to spare: the rest on this one
    for (NcclComm* c : comms) c->abort();  // abort() is once per communicator
  }
  for (auto& t : threads) t.join();
}

// ---- collectives ----
void all_reduce(const void* send_buf, void* recv_buf, std::size_t count, NcclComm& comm, cudaStream_t stream,
                ncclDataType_t type) {
  TW_NCCL_ENQUEUE(comm, ncclAllReduce(send_buf, recv_buf, count, type, ncclSum, comm.live(), stream));
}
void all_gather(const void* send_buf, void* recv_buf, std::size_t send_count, NcclComm& comm, cudaStream_t stream,
                ncclDataType_t type) {
  TW_NCCL_ENQUEUE(comm, ncclAllGather(send_buf, recv_buf, send_count, type, comm.live(), stream));
}
void reduce_scatter(const void* send_buf, void* recv_buf, std::size_t recv_count, NcclComm& comm, cudaStream_t stream,
                    ncclDataType_t type) {
  TW_NCCL_ENQUEUE(comm, ncclReduceScatter(send_buf, recv_buf, recv_count, type, ncclSum, comm.live(), stream));
}
void broadcast(const void* send_buf, void* recv_buf, std::size_t count, int root, NcclComm& comm, cudaStream_t stream,
               ncclDataType_t type) {
  TW_NCCL_ENQUEUE(comm, ncclBroadcast(send_buf, recv_buf, count, type, root, comm.live(), stream));
}

namespace {
std::size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: break;
  }
  return 1;
}
}  // namespace

void all_to_all(const void* send_buf, void* recv_buf, std::size_t count_per_peer, NcclComm& comm, cudaStream_t stream,
                ncclDataType_t type) {
  const std::size_t n = static_cast<std::size_t>(comm.size());
  std::vector<std::size_t> counts(n, count_per_peer);
  std::vector<std::size_t> displs(n);
  for (std::size_t p = 0; p < n; ++p) displs[p] = p * count_per_peer;
  all_to_all_v(send_buf, counts, displs, recv_buf, counts, displs, comm, stream, type);
}

void all_to_all_v(const void* send_buf, const std::vector<std::size_t>& send_counts,
                  const std::vector<std::size_t>& send_displs, void* recv_buf,
                  const std::vector<std::size_t>& recv_counts, const std::vector<std::size_t>& recv_displs,
                  NcclComm& comm, cudaStream_t stream, ncclDataType_t type) {
  const auto n = static_cast<std::size_t>(comm.size());
  if (send_counts.size() != n || send_displs.size() != n || recv_counts.size() != n || recv_displs.size() != n) {
    throw InputError(rank_prefix() + "all_to_all_v on group " + comm.group_name() + ": counts/displacements need " +
                     std::to_string(n) + " entries (one per member)");
  }
  static_cast<void>(comm.live());  // before the group: an aborted communicator leaves no group open
  const std::size_t es = type_size(type);
  const auto* s = static_cast<const char*>(send_buf);
  auto* r = static_cast<char*>(recv_buf);
  TW_NCCL_ENQUEUE(comm, ncclGroupStart());
  for (std::size_t p = 0; p < n; ++p) {
    if (send_counts[p] > 0) {
      TW_NCCL_ENQUEUE(
          comm, ncclSend(s + send_displs[p] * es, send_counts[p], type, static_cast<int>(p), comm.live(), stream));
    }
    if (recv_counts[p] > 0) {
      TW_NCCL_ENQUEUE(
          comm, ncclRecv(r + recv_displs[p] * es, recv_counts[p], type, static_cast<int>(p), comm.live(), stream));
    }
  }
  TW_NCCL_ENQUEUE(comm, ncclGroupEnd());
}

void send(const void* buf, std::size_t count, int peer, NcclComm& comm, cudaStream_t stream, ncclDataType_t type) {
  TW_NCCL_ENQUEUE(comm, ncclSend(buf, count, type, peer, comm.live(), stream));
}
void recv(void* buf, std::size_t count, int peer, NcclComm& comm, cudaStream_t stream, ncclDataType_t type) {
  TW_NCCL_ENQUEUE(comm, ncclRecv(buf, count, type, peer, comm.live(), stream));
}

}  // namespace threewalls::backend
