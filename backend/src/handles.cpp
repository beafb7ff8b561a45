#include "threewalls/backend/handles.hpp"

#include "threewalls/backend/error.hpp"

namespace threewalls::backend {

int device_count(std::string* reason) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    static_cast<void>(cudaGetLastError());
    if (reason != nullptr) *reason = std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
    return 0;
  }
  if (n == 0 && reason != nullptr) *reason = "cudaGetDeviceCount reports 0 devices";
  return n;
}

void set_device(int device) { TW_CUDA_CHECK(cudaSetDevice(device)); }

void release_devices() {
  const int n = device_count();
  for (int d = 0; d < n; ++d) {
    TW_CUDA_CHECK(cudaSetDevice(d));
    TW_CUDA_CHECK(cudaDeviceReset());
  }
}

int current_device() {
  int d = -1;
  TW_CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

std::string device_name() {
  cudaDeviceProp prop{};
  TW_CUDA_CHECK(cudaGetDeviceProperties(&prop, current_device()));
  return prop.name;
}

// ---- Stream ----
Stream::Stream(int priority) {
  TW_CUDA_CHECK(cudaStreamCreateWithPriority(&s_, cudaStreamNonBlocking, priority));
}
Stream::~Stream() {
  if (s_ != nullptr) static_cast<void>(cudaStreamDestroy(s_));
}
Stream& Stream::operator=(Stream&& o) noexcept {
  if (this != &o) {
    if (s_ != nullptr) static_cast<void>(cudaStreamDestroy(s_));
    s_ = std::exchange(o.s_, nullptr);
  }
  return *this;
}
void Stream::synchronize() const { TW_CUDA_CHECK(cudaStreamSynchronize(s_)); }

// ---- Event ----
Event::Event(bool timing) {
  TW_CUDA_CHECK(cudaEventCreateWithFlags(&e_, timing ? cudaEventDefault : cudaEventDisableTiming));
}
Event::~Event() {
  if (e_ != nullptr) static_cast<void>(cudaEventDestroy(e_));
}
Event& Event::operator=(Event&& o) noexcept {
  if (this != &o) {
    if (e_ != nullptr) static_cast<void>(cudaEventDestroy(e_));
    e_ = std::exchange(o.e_, nullptr);
  }
  return *this;
}
void Event::record(cudaStream_t stream) const { TW_CUDA_CHECK(cudaEventRecord(e_, stream)); }
void Event::synchronize() const { TW_CUDA_CHECK(cudaEventSynchronize(e_)); }
bool Event::done() const {
  const cudaError_t err = cudaEventQuery(e_);
  if (err == cudaErrorNotReady) return false;
  TW_CUDA_CHECK(err);
  return true;
}
float Event::elapsed_ms(const Event& start, const Event& stop) {
  float ms = 0.0F;
  TW_CUDA_CHECK(cudaEventElapsedTime(&ms, start.e_, stop.e_));
  return ms;
}

// ---- EventPool ----
EventPool::EventPool(bool timing, std::size_t reserve) : timing_(timing) {
  for (std::size_t i = 0; i < reserve; ++i) {
    free_.emplace_back(timing_);
    ++created_;
  }
}
EventPool::Lease EventPool::acquire() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!free_.empty()) {
      Event e = std::move(free_.back());
      free_.pop_back();
      return Lease(this, std::move(e));
    }
    ++created_;
  }
  return Lease(this, Event(timing_));
}
void EventPool::give_back(Event e) {
  std::lock_guard<std::mutex> lock(mu_);
  free_.push_back(std::move(e));
}
std::size_t EventPool::created() const {
  std::lock_guard<std::mutex> lock(mu_);
  return created_;
}
std::size_t EventPool::free_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return free_.size();
}
EventPool::Lease::~Lease() {
  if (pool_ != nullptr && event_.get() != nullptr) pool_->give_back(std::move(event_));
}
EventPool::Lease& EventPool::Lease::operator=(Lease&& o) noexcept {
  if (this != &o) {
    if (pool_ != nullptr && event_.get() != nullptr) pool_->give_back(std::move(event_));
    pool_ = std::exchange(o.pool_, nullptr);
    event_ = std::move(o.event_);
  }
  return *this;
}

// ---- DeviceBuffer ----
DeviceBuffer::DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
  if (bytes == 0) return;
  const cudaError_t err = cudaMalloc(&p_, bytes);
  if (err == cudaErrorMemoryAllocation) detail::throw_oom(err, "cudaMalloc(&p_, bytes)", __FILE__, __LINE__, bytes);
  TW_CUDA_CHECK(err);
}
DeviceBuffer::~DeviceBuffer() {
  if (p_ != nullptr) static_cast<void>(cudaFree(p_));
}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (p_ != nullptr) static_cast<void>(cudaFree(p_));
    p_ = std::exchange(o.p_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

// ---- PinnedBuffer ----
PinnedBuffer::PinnedBuffer(std::size_t bytes) : bytes_(bytes) {
  if (bytes == 0) return;
  const cudaError_t err = cudaMallocHost(&p_, bytes);
  if (err == cudaErrorMemoryAllocation) {
    static_cast<void>(cudaGetLastError());
    throw DeviceError(rank_prefix() + "cudaMallocHost failed: could not pin " + format_size(bytes) +
                      " of host memory (cudaErrorMemoryAllocation)");
  }
  TW_CUDA_CHECK(err);
}
PinnedBuffer::~PinnedBuffer() {
  if (p_ != nullptr) static_cast<void>(cudaFreeHost(p_));
}
PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& o) noexcept {
  if (this != &o) {
    if (p_ != nullptr) static_cast<void>(cudaFreeHost(p_));
    p_ = std::exchange(o.p_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

// ---- graphs ----
CudaGraph::~CudaGraph() {
  if (g_ != nullptr) static_cast<void>(cudaGraphDestroy(g_));
}
CudaGraph& CudaGraph::operator=(CudaGraph&& o) noexcept {
  if (this != &o) {
    if (g_ != nullptr) static_cast<void>(cudaGraphDestroy(g_));
    g_ = std::exchange(o.g_, nullptr);
  }
  return *this;
}
std::size_t CudaGraph::num_nodes() const {
  std::size_t n = 0;
  TW_CUDA_CHECK(cudaGraphGetNodes(g_, nullptr, &n));
  return n;
}
void CudaGraph::begin_capture(cudaStream_t s) {
  TW_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
}
CudaGraph CudaGraph::end_capture(cudaStream_t s) {
  cudaGraph_t g = nullptr;
  TW_CUDA_CHECK(cudaStreamEndCapture(s, &g));
  return CudaGraph(g);
}

GraphExec::GraphExec(const CudaGraph& g) {
  TW_CUDA_CHECK(cudaGraphInstantiate(&e_, g.get(), 0));
}
GraphExec::~GraphExec() {
  if (e_ != nullptr) static_cast<void>(cudaGraphExecDestroy(e_));
}
GraphExec& GraphExec::operator=(GraphExec&& o) noexcept {
  if (this != &o) {
    if (e_ != nullptr) static_cast<void>(cudaGraphExecDestroy(e_));
    e_ = std::exchange(o.e_, nullptr);
  }
  return *this;
}
void GraphExec::launch(cudaStream_t s) const { TW_CUDA_CHECK(cudaGraphLaunch(e_, s)); }

}  // namespace threewalls::backend
