#include "threewalls/profiler/cuda_profiler.hpp"

#include <algorithm>
#include <string>
#include <thread>

#include "threewalls/core/error.hpp"
#include "threewalls/profiler/summary.hpp"

namespace threewalls::profiler::cuda {
namespace {

std::string short_file(const char* file) {
  std::string f(file);
  const auto pos = f.rfind("/profiler/");
  return pos == std::string::npos ? f : f.substr(pos + 1);
}

// The profiler does not depend on backend/, so it has its own (small) check: rank, call, file:line.
void check(cudaError_t err, const char* call, const char* file, int line) {
  if (err == cudaSuccess) return;
  throw SystemError("profiler: " + std::string(call) + " failed at " + short_file(file) + ":" + std::to_string(line) +
                    ": " + cudaGetErrorString(err) + " (" + cudaGetErrorName(err) + ")");
}
#define TW_PROF_CHECK(call) check((call), #call, __FILE__, __LINE__)

constexpr std::uint32_t kNone = 0xffffffffU;

}  // namespace

// ---- CudaEventClock ----
CudaEventClock::CudaEventClock(std::size_t reserve) {
  for (std::size_t i = 0; i < reserve; ++i) {
    const Marker m = acquire(false);
    free_.push_back(m.id);
  }
}

CudaEventClock::~CudaEventClock() {
  for (cudaEvent_t e : events_) static_cast<void>(cudaEventDestroy(e));
}

CudaEventClock::Marker CudaEventClock::acquire(bool pinned) {
  if (!pinned && !free_.empty()) {
    const std::uint32_t id = free_.back();
    free_.pop_back();
    return Marker{id};
  }
  cudaEvent_t e = nullptr;
  TW_PROF_CHECK(cudaEventCreateWithFlags(&e, cudaEventDefault));
  events_.push_back(e);
  pinned_.push_back(pinned ? 1 : 0);
  return Marker{static_cast<std::uint32_t>(events_.size() - 1)};
}

CudaEventClock::Marker CudaEventClock::mark(cudaStream_t s) {
  const Marker m = acquire(false);
  const cudaError_t err = cudaEventRecord(events_[m.id], s);
  if (err != cudaSuccess) {
    free_.push_back(m.id);
    check(err, "cudaEventRecord(event, stream)", __FILE__, __LINE__);
  }
  return m;
}

CudaEventClock::Marker CudaEventClock::mark_pinned(cudaStream_t s) {
  const Marker m = acquire(true);
  TW_PROF_CHECK(cudaEventRecordWithFlags(events_[m.id], s, cudaEventRecordExternal));
  return m;
}

bool CudaEventClock::done(Marker m) {
  if (m.id == kNone) return true;
  const cudaError_t err = cudaEventQuery(events_[m.id]);
  if (err == cudaErrorNotReady) return false;
  TW_PROF_CHECK(err);
  return true;
}

double CudaEventClock::elapsed_us(Marker a, Marker b) {
  if (a.id == kNone || b.id == kNone) return 0.0;
  float ms = 0.0F;
  TW_PROF_CHECK(cudaEventElapsedTime(&ms, events_[a.id], events_[b.id]));
  return static_cast<double>(ms) * 1000.0;
}

void CudaEventClock::release(Marker m) {
  if (m.id == kNone || pinned_[m.id] != 0) return;
  free_.push_back(m.id);
}

// ---- NVTX ----
const nvtx3::registered_string_in<NvtxDomain>& NvtxNames::get(std::string_view name) {
  for (const auto& [n, s] : names_) {
    if (n == name) return *s;
  }
  names_.emplace_back(std::string(name), std::make_unique<nvtx3::registered_string_in<NvtxDomain>>(std::string(name)));
  return *names_.back().second;
}

NvtxScope::NvtxScope(const nvtx3::registered_string_in<NvtxDomain>& name, std::int32_t payload, bool on) : on_(on) {
  if (!on_) return;
  const nvtx3::event_attributes attr{name, nvtx3::payload{payload}};
  nvtxDomainRangePushEx(nvtx3::domain::get<NvtxDomain>(), attr.get());
}

NvtxScope::~NvtxScope() {
  if (on_) nvtxDomainRangePop(nvtx3::domain::get<NvtxDomain>());
}

NvtxScope& NvtxScope::operator=(NvtxScope&& o) noexcept {
  if (this != &o) {
    if (on_) nvtxDomainRangePop(nvtx3::domain::get<NvtxDomain>());
    on_ = std::exchange(o.on_, false);
  }
  return *this;
}

// ---- Profiler ----
Profiler::Profiler(ProfilerOptions options) : options_(std::move(options)), start_(std::chrono::steady_clock::now()) {
  enabled_ = options_.sampling.enabled;
  if (!enabled_) return;  // no file, no event, no NVTX
  SamplingPolicy policy(options_.sampling, options_.world_size);
  RunHeader header = make_header("real", options_.world_size);
  header.scenario = {options_.run_name, "", ""};
  int device = 0;
  TW_PROF_CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  TW_PROF_CHECK(cudaGetDeviceProperties(&prop, device));
  header.device = prop.name;
  header.argv = options_.argv;
  header.seed = options_.seed;
  header.settings = options_.settings;
  header.settings["timer"] = "CUDA events (recycled pool) + NVTX3 domain threewalls";
  WriterOptions wo;
  wo.overwrite = options_.overwrite;
  wo.local_ranks = {options_.rank};
  wo.mode = options_.creator ? WriterOptions::Mode::create : WriterOptions::Mode::join;
  wo.write_run_json = options_.creator;
  writer_ = std::make_unique<RunDirWriter>(options_.out_dir, header, policy, wo);
  sink_ = std::make_unique<RecordSink>(writer_.get(), std::vector<int>{options_.rank});
  clock_ = std::make_unique<CudaEventClock>();
  recorder_ = std::make_unique<StepRecorder<CudaEventClock>>(*clock_, policy, options_.rank, sink_.get());
}

Profiler::~Profiler() {
  try {
    finish();
  } catch (...) {  // NOLINT(bugprone-empty-catch): destructors must not throw; call finish() to see errors
  }
}

double Profiler::host_now_us() const {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start_).count();
}

Profiler::PhaseId Profiler::phase_id(std::string_view name) {
  for (std::size_t i = 0; i < phase_names_.size(); ++i) {
    if (phase_names_[i] == name) return static_cast<PhaseId>(i);
  }
  phase_names_.emplace_back(name);
  phase_ids_.push_back(sink_ ? sink_->phase_id(name) : 0);
  return static_cast<PhaseId>(phase_names_.size() - 1);
}

void Profiler::begin_step(int step, cudaStream_t stream) {
  if (!enabled_) return;
  if (!recorder_->has_anchor()) {
    // Align device time with the host clock once: an event recorded on an idle stream.
    TW_PROF_CHECK(cudaStreamSynchronize(stream));
    const auto m = clock_->mark(stream);
    const double host = host_now_us();
    TW_PROF_CHECK(cudaEventSynchronize(clock_->event(m)));
    recorder_->set_anchor(m, host);
  }
  recorder_->harvest();
  recorder_->begin_step(step, stream);
}

Profiler::Phase::Phase(Phase&& o) noexcept
    : prof_(std::exchange(o.prof_, nullptr)), stream_(o.stream_), start_(o.start_), record_(o.record_),
      nvtx_(std::move(o.nvtx_)), timed_(std::exchange(o.timed_, false)) {}

Profiler::Phase Profiler::phase(PhaseId id, cudaStream_t stream, const PhaseInfo& info) {
  Phase p;
  if (!enabled_) return p;
  p.prof_ = this;
  p.stream_ = stream;
  p.nvtx_ = NvtxScope(nvtx_.get(phase_names_[id]), info.layer, true);
  if (recorder_->records_phase(info.coarse)) {
    PhaseRecord& r = p.record_;
    r.phase = phase_ids_[id];
    r.stream = sink_->stream_id(info.stream);
    r.layer = info.layer;
    r.microbatch = info.microbatch;
    r.wall = info.wall;
    r.bytes = info.bytes;
    r.flops = info.flops;
    r.group = info.group.empty() ? kNoName : sink_->group_id(info.group);
    r.coarse = info.coarse;
    p.start_ = clock_->mark(stream);
    p.timed_ = true;
  }
  return p;
}

void Profiler::Phase::end() {
  if (prof_ == nullptr) return;
  if (timed_) {
    const auto stop = prof_->clock_->mark(stream_);
    prof_->recorder_->device_phase(record_, start_, stop);
    timed_ = false;
  }
  nvtx_ = NvtxScope();
  prof_ = nullptr;
}

void Profiler::end_step(cudaStream_t stream) {
  if (!enabled_) return;
  CudaEventClock::Marker end{};
  if (recorder_->recording()) end = clock_->mark(stream);
  recorder_->end_step(end);
  recorder_->harvest();
}

void Profiler::finish() {
  if (!enabled_ || finished_) return;
  finished_ = true;
  recorder_->drain([] { std::this_thread::sleep_for(std::chrono::microseconds(100)); });
  sink_->close();
  SummaryInputs in;
  in.gpu = writer_->header().device;
  const SummaryBuilder builder(writer_->header(), in);
  writer_->write_summary(builder.json(writer_->kept_steps(), writer_->kept_phases(), writer_->names()));
  writer_->close();
}

}  // namespace threewalls::profiler::cuda
