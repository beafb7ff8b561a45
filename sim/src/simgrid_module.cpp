// SimGrid adapter: builds the platform of platform.hpp in SimGrid and runs groups of flows on it.
//
// Zones (docs/simulator.md, "SimGrid platform"): a root zone without routes holds four star zones,
// one per kind of port, each with one host per GPU whose split-duplex link(s) are that GPU's port:
//   nvlink  gpu.<r>, link nvlink.<r> (UP = nvlink_up, DOWN = nvlink_down); the star's centre is the
//           NVSwitch of a node (transfers between nodes never use these hosts);
//   pcie    pcie_port.<r>, link pcie.<r> (UP = device to host, DOWN = host to device), and
//           host_memory.<n> per node without a link;
//   nic     nic.<r>, link nic.<r> (UP = nic_up, DOWN = nic_down): transfers under one leaf switch;
//   spine   nic_spine.<r> routed through nic.<r> and its spine port spine.<r> (UP = spine_up, DOWN =
//           spine_down): transfers across leaves.
// Which pair of hosts a flow uses is decided by Platform::gpu_endpoints, which also rules out pairs
// without a physical route, so the star zones reproduce Platform::route exactly (a test checks it).
// Four large zones rather than one per node: SimGrid 3.32 looks names up zone by zone, so building
// is quadratic in the number of zones.
#include "threewalls/sim/simgrid_network.hpp"

#include <simgrid/s4u.hpp>
#include <simgrid/version.h>

#include <atomic>
#include <cmath>
#include <exception>
#include <limits>
#include <unordered_map>

#include "threewalls/core/error.hpp"

namespace sg = simgrid::s4u;

namespace threewalls::sim {

namespace {
std::atomic<bool> g_engine_created{false};
}

struct SimGridEngine::Impl {
  const Platform& platform;
  std::unique_ptr<sg::Engine> engine;
  std::vector<sg::Link*> links;  // by platform link id
  std::vector<sg::Host*> gpu_hosts, nic_hosts, spine_hosts, pcie_hosts, node_hosts;
  sg::Host* controller = nullptr;
  std::vector<sg::CommPtr> live;
  std::vector<std::uint64_t> live_group;
  std::unordered_map<std::uint64_t, std::size_t> remaining;  // flows left per group

  explicit Impl(const Platform& p) : platform(p) {}

  sg::Host* host_of(Endpoint e) const {
    const auto i = static_cast<std::size_t>(e.index);
    switch (e.kind) {
      case PortKind::gpu: return gpu_hosts.at(i);
      case PortKind::nic: return nic_hosts.at(i);
      case PortKind::nic_spine: return spine_hosts.at(i);
      case PortKind::gpu_pcie: return pcie_hosts.at(i);
      case PortKind::host: return node_hosts.at(i);
    }
    return nullptr;
  }

  void build() {
    const int world = platform.world();
    links.assign(platform.links().size(), nullptr);
    gpu_hosts.resize(static_cast<std::size_t>(world));
    nic_hosts.resize(static_cast<std::size_t>(world));
    spine_hosts.resize(static_cast<std::size_t>(world));
    pcie_hosts.resize(static_cast<std::size_t>(world));
    node_hosts.resize(static_cast<std::size_t>(platform.nodes()));
    auto bw = [&](LinkKind k, int index) { return platform.links()[platform.link_id(k, index)].bandwidth.value; };
    auto duplex = [&](sg::NetZone* z, const std::string& name, LinkKind up, LinkKind down, int index) {
      sg::SplitDuplexLink* l = z->create_split_duplex_link(name, bw(up, index));
      l->set_latency(0.0);
      l->get_link_up()->set_bandwidth(bw(up, index));
      l->get_link_down()->set_bandwidth(bw(down, index));
      links[platform.link_id(up, index)] = l->get_link_up();
      links[platform.link_id(down, index)] = l->get_link_down();
      return l;
    };
    auto* root = sg::create_full_zone("threewalls");
    auto* nvlink = sg::create_star_zone("nvlink");
    nvlink->set_parent(root);
    auto* pcie = sg::create_star_zone("pcie");
    pcie->set_parent(root);
    auto* nic = sg::create_star_zone("nic");
    nic->set_parent(root);
    auto* spine = sg::create_star_zone("spine");
    spine->set_parent(root);
    for (int n = 0; n < platform.nodes(); ++n) {
      sg::Host* mem = pcie->create_host("host_memory." + std::to_string(n), 1e9);
      pcie->add_route(mem->get_netpoint(), nullptr, nullptr, nullptr, {}, true);
      node_hosts[static_cast<std::size_t>(n)] = mem;
    }
    for (int r = 0; r < world; ++r) {
      const std::string rs = std::to_string(r);
      const auto ri = static_cast<std::size_t>(r);
      sg::Host* g = nvlink->create_host("gpu." + rs, 1e9);
      auto* nv = duplex(nvlink, "nvlink." + rs, LinkKind::nvlink_up, LinkKind::nvlink_down, r);
      nvlink->add_route(g->get_netpoint(), nullptr, nullptr, nullptr, {{nv, sg::LinkInRoute::Direction::UP}}, true);
      gpu_hosts[ri] = g;
      sg::Host* ph = pcie->create_host("pcie_port." + rs, 1e9);
      auto* pl = duplex(pcie, "pcie." + rs, LinkKind::pcie_up, LinkKind::pcie_down, r);
      pcie->add_route(ph->get_netpoint(), nullptr, nullptr, nullptr, {{pl, sg::LinkInRoute::Direction::UP}}, true);
      pcie_hosts[ri] = ph;
      sg::Host* nh = nic->create_host("nic." + rs, 1e9);
      auto* nl = duplex(nic, "nic." + rs, LinkKind::nic_up, LinkKind::nic_down, r);
      nic->add_route(nh->get_netpoint(), nullptr, nullptr, nullptr, {{nl, sg::LinkInRoute::Direction::UP}}, true);
      nic_hosts[ri] = nh;
      sg::Host* sh = spine->create_host("nic_spine." + rs, 1e9);
      auto* sl = duplex(spine, "spine." + rs, LinkKind::spine_up, LinkKind::spine_down, r);
      spine->add_route(sh->get_netpoint(), nullptr, nullptr, nullptr,
                       {{nl, sg::LinkInRoute::Direction::UP}, {sl, sg::LinkInRoute::Direction::UP}}, true);
      spine_hosts[ri] = sh;
    }
    nvlink->seal();
    pcie->seal();
    nic->seal();
    spine->seal();
    controller = root->create_host("controller", 1e9);
    root->seal();
  }

  void finish(std::size_t i, std::vector<std::uint64_t>& completed) {
    const std::uint64_t group = live_group[i];
    live[i] = std::move(live.back());
    live.pop_back();
    live_group[i] = live_group.back();
    live_group.pop_back();
    auto it = remaining.find(group);
    if (--it->second == 0) {
      remaining.erase(it);
      completed.push_back(group);
    }
  }
};

SimGridEngine::SimGridEngine(const Platform& platform) {
  if (g_engine_created.exchange(true)) {
    throw SystemError("SimGrid runs one simulation per process: a second SimGrid engine was requested");
  }
  impl_ = std::make_unique<Impl>(platform);
  static char arg0[] = "threewalls";
  static char arg1[] = "--log=root.thres:warning";
  static char* argv[] = {arg0, arg1, nullptr};
  int argc = 2;
  impl_->engine = std::make_unique<sg::Engine>(&argc, argv);
  for (const char* setting : kNetworkModelSettings) sg::Engine::set_config(setting);
  impl_->build();
}

SimGridEngine::~SimGridEngine() = default;

void SimGridEngine::run(const std::function<void()>& body) {
  std::exception_ptr error;
  sg::Actor::create("executor", impl_->controller, [this, &body, &error]() {
    try {
      body();
    } catch (...) {
      error = std::current_exception();
    }
    // Never drop a running communication: let what is in flight finish.
    if (!impl_->live.empty()) sg::Comm::wait_all(impl_->live);
    impl_->live.clear();
    impl_->live_group.clear();
    impl_->remaining.clear();
  });
  impl_->engine->run();
  if (error) std::rethrow_exception(error);
}

double SimGridEngine::now() const { return sg::Engine::get_clock(); }

double SimGridEngine::advance(double until, std::vector<std::uint64_t>& completed) {
  Impl& m = *impl_;
  const double now = sg::Engine::get_clock();
  if (m.live.empty()) {
    if (std::isfinite(until) && until > now) sg::this_actor::sleep_until(until);
    return sg::Engine::get_clock();
  }
  const double timeout = std::isfinite(until) ? std::max(0.0, until - now) : -1.0;
  const ssize_t i = sg::Comm::wait_any_for(m.live, timeout);
  if (i < 0) return sg::Engine::get_clock();
  m.finish(static_cast<std::size_t>(i), completed);
  // Others that finished at the same instant.
  while (!m.live.empty()) {
    const ssize_t j = sg::Comm::test_any(m.live);
    if (j < 0) break;
    m.finish(static_cast<std::size_t>(j), completed);
  }
  return sg::Engine::get_clock();
}

void SimGridEngine::start_group(std::uint64_t id, std::span<const PlacedFlow> flows) {
  Impl& m = *impl_;
  if (flows.empty()) throw std::logic_error("start_group: a group without flows");
  if (m.remaining.count(id) != 0) throw std::logic_error("start_group: group id already running");
  m.remaining[id] = flows.size();
  for (const PlacedFlow& f : flows) {
    // Validate before SimGrid sees it: a missing route or a zero-byte comm would abort or hang.
    if (!(f.bytes >= 1.0) || !std::isfinite(f.bytes) || f.links.empty()) {
      throw std::logic_error("start_group: a flow must carry at least one byte on a non-empty route");
    }
    sg::CommPtr c = sg::Comm::sendto_init();
    c->set_payload_size(static_cast<std::uint64_t>(std::llround(f.bytes)));
    c->set_source(m.host_of(f.src));
    c->set_destination(m.host_of(f.dst));  // starts the communication
    m.live.push_back(std::move(c));
    m.live_group.push_back(id);
  }
}

bool SimGridEngine::busy() const { return !impl_->live.empty(); }

void SimGridEngine::set_link_bandwidth(std::uint32_t link, BytesPerSecond bw) {
  if (!(bw.value > 0.0)) throw std::logic_error("set_link_bandwidth: bandwidth must be positive");
  impl_->links.at(link)->set_bandwidth(bw.value);
}

std::vector<std::string> SimGridEngine::route_names(Endpoint src, Endpoint dst) const {
  std::vector<sg::Link*> route;
  double latency = 0.0;
  impl_->host_of(src)->route_to(impl_->host_of(dst), route, &latency);
  std::unordered_map<const sg::Link*, std::uint32_t> id_of;
  for (std::uint32_t i = 0; i < impl_->links.size(); ++i) id_of.emplace(impl_->links[i], i);
  std::vector<std::string> names;
  for (const sg::Link* l : route) {
    auto it = id_of.find(l);
    names.push_back(it == id_of.end() ? l->get_name() : impl_->platform.link_name(it->second));
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
