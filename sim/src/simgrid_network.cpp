// SimGridEngine: loads libthreewalls_simgrid.so (simgrid_module.hpp) on first use and forwards to it.
#include "threewalls/sim/simgrid_network.hpp"

#include <dlfcn.h>
#include <xbt/base.h>  // macros that simgrid/version.h needs first

#include <simgrid/version.h>  // macros only: the version the module is built against

#include <algorithm>
#include <atomic>
#include <numeric>
#include <stdexcept>
#include <string>

#include "simgrid_module.hpp"
#include "threewalls/core/error.hpp"

#ifndef THREEWALLS_SIMGRID_MODULE_PATH
#error "THREEWALLS_SIMGRID_MODULE_PATH: the build tree's libthreewalls_simgrid.so (sim/CMakeLists.txt)"
#endif

namespace threewalls::sim {

namespace {

std::atomic<bool> g_engine_created{false};
// The process's SimGrid engine once its SimGridEngine is gone (never destroyed: see ~SimGridEngine).
simgrid_module::Engine* g_kept_engine = nullptr;

// The folder of the running executable, with a trailing '/' ("" when unknown).
std::string executable_folder() {
  std::string path(4096, '\0');
  const ssize_t n = ::readlink("/proc/self/exe", path.data(), path.size());
  if (n <= 0 || static_cast<std::size_t>(n) >= path.size()) return {};
  path.resize(static_cast<std::size_t>(n));
  return path.substr(0, path.rfind('/') + 1);
}

// The module's create function. Looked for beside the running executable (a carried copy of the
// binaries), then where this build tree put it. Loaded once, never unloaded (SimGrid keeps global
// state until the process ends).
simgrid_module::CreateFn load_module() {
  static simgrid_module::CreateFn create = nullptr;
  if (create != nullptr) return create;
  const std::string beside = executable_folder() + simgrid_module::kModuleFile;
  std::string tried;
  for (const std::string& path : {beside, std::string(THREEWALLS_SIMGRID_MODULE_PATH)}) {
    void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* why = ::dlerror();
      tried += "\n  " + path + ": " + (why != nullptr ? why : "not loadable");
      continue;
    }
    void* sym = ::dlsym(handle, simgrid_module::kCreateSymbol);
    if (sym == nullptr) {
      tried += "\n  " + path + ": no symbol " + simgrid_module::kCreateSymbol;
      continue;
    }
    create = reinterpret_cast<simgrid_module::CreateFn>(sym);
    return create;
  }
  throw SystemError(std::string("flow fidelity needs the SimGrid module ") + simgrid_module::kModuleFile +
                    " (build target threewalls_simgrid; keep it beside threewalls); tried:" + tried);
}

simgrid_module::PlatformSpec spec_of(const Platform& platform, std::vector<int> ranks) {
  simgrid_module::PlatformSpec spec;
  spec.world = platform.world();
  spec.nodes = platform.nodes();
  spec.bandwidth_bytes_per_s.reserve(platform.links().size());
  for (const Link& l : platform.links()) spec.bandwidth_bytes_per_s.push_back(l.bandwidth.value);
  spec.rank_links.resize(static_cast<std::size_t>(spec.world));
  for (int r = 0; r < spec.world; ++r) {
    for (int k = 0; k < kLinkKinds; ++k) {
      spec.rank_links[static_cast<std::size_t>(r)][static_cast<std::size_t>(k)] =
          platform.link_id(static_cast<LinkKind>(k), r);
    }
  }
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  for (const int r : ranks) {
    if (r < 0 || r >= spec.world) {
      throw std::logic_error("SimGridEngine: rank " + std::to_string(r) + " is outside the platform's " +
                             std::to_string(spec.world) + " GPUs");
    }
    spec.node_of_rank.push_back(platform.node_of(r));
  }
  spec.ranks = std::move(ranks);
  return spec;
}

}  // namespace

void preload_simgrid_module() { load_module(); }

struct SimGridEngine::Impl {
  const Platform& platform;
  std::unique_ptr<simgrid_module::Engine> engine;
};

namespace {
std::vector<int> every_rank(const Platform& platform) {
  std::vector<int> ranks(static_cast<std::size_t>(platform.world()));
  std::iota(ranks.begin(), ranks.end(), 0);
  return ranks;
}
}  // namespace

SimGridEngine::SimGridEngine(const Platform& platform) : SimGridEngine(platform, every_rank(platform)) {}

SimGridEngine::SimGridEngine(const Platform& platform, std::vector<int> ranks, bool solo_flows) {
  if (g_engine_created.exchange(true)) {
    throw SystemError("SimGrid runs one simulation per process: a second SimGrid engine was requested");
  }
  const simgrid_module::CreateFn create = load_module();
  std::string error;
  simgrid_module::PlatformSpec spec = spec_of(platform, std::move(ranks));
  spec.solo_flows = solo_flows;
  std::unique_ptr<simgrid_module::Engine> engine(create(spec, error));
  if (!engine) throw SystemError("SimGrid could not build the platform: " + error);
  impl_ = std::make_unique<Impl>(Impl{platform, std::move(engine)});
}

SimGridEngine::~SimGridEngine() {
  // A process runs one SimGrid engine, and the engine's platform (hosts, links, zones, the sharing
  // system: time and memory in proportion to the GPUs) would be freed here only for the process to
  // end: it is kept instead, reachable from g_kept_engine, and the operating system takes it back.
  if (impl_) g_kept_engine = impl_->engine.release();
}

void SimGridEngine::run(const std::function<void()>& body) { impl_->engine->run(body); }

double SimGridEngine::now() const { return impl_->engine->now(); }

double SimGridEngine::advance(double until, std::vector<std::uint64_t>& completed) {
  return impl_->engine->advance(until, completed);
}

void SimGridEngine::start_group(std::uint64_t id, std::span<const PlacedFlow> flows) {
  impl_->engine->start_group(id, flows);
}

bool SimGridEngine::busy() const { return impl_->engine->busy(); }

void SimGridEngine::set_link_bandwidth(std::uint32_t link, BytesPerSecond bw) {
  impl_->engine->set_link_bandwidth(link, bw.value);
}

std::vector<std::string> SimGridEngine::route_names(Endpoint src, Endpoint dst) const {
  std::vector<std::string> names;
  for (const std::uint32_t id : impl_->engine->route(src, dst)) {
    names.push_back(id == simgrid_module::kNoLink ? "(a link the platform does not have)"
                                                  : impl_->platform.link_name(id));
  }
  return names;
}

OrderedJson SimGridEngine::settings() {
  OrderedJson j;
  j["engine"] = "SimGrid " + std::to_string(SIMGRID_VERSION_MAJOR) + "." + std::to_string(SIMGRID_VERSION_MINOR);
  OrderedJson cfg = OrderedJson::array();
  for (const char* s : kNetworkModelSettings) cfg.push_back(s);
  j["cfg"] = cfg;
  j["link_latency_s"] = 0.0;
  return j;
}

}  // namespace threewalls::sim
