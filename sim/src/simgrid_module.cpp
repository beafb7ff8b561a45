// SimGrid adapter, built as the module libthreewalls_simgrid.so (simgrid_module.hpp): builds the
// platform of platform.hpp in SimGrid and runs groups of flows on it.
//
// Zones (docs/simulator.md, "SimGrid platform"): a root zone without routes holds four star zones,
// one per kind of port, each with one host per GPU of PlatformSpec::ranks (the GPUs whose ports the
// simulation's flows can use; no other GPU costs anything) whose split-duplex link(s) are that GPU's port:
//   nvlink  gpu.<r>, link nvlink.<r> (UP = nvlink_up, DOWN = nvlink_down); the star's centre is the
//           NVSwitch of a node (transfers between nodes never use these hosts);
//   pcie    pcie_port.<r>, link pcie.<r> (UP = device to host, DOWN = host to device), and
//           host_memory.<n> per node of those GPUs, without a link;
//   nic     nic.<r>, link nic.<r> (UP = nic_up, DOWN = nic_down): transfers under one leaf switch;
//   spine   nic_spine.<r> routed through nic.<r> and its spine port spine.<r> (UP = spine_up, DOWN =
//           spine_down): transfers across leaves.
// Which pair of hosts a flow uses is decided by Platform::gpu_endpoints, which also rules out pairs
// without a physical route, so the star zones reproduce Platform::route exactly (a test checks it).
// Errors are std::logic_error (a caller's bug) or reported through create's `error`.
// Four large zones rather than one per node: SimGrid 3.32 looks names up zone by zone, so building
// is quadratic in the number of zones.
#include "simgrid_module.hpp"
#include "threewalls/sim/simgrid_network.hpp"  // kNetworkModelSettings

#include <simgrid/kernel/resource/Model.hpp>
#include <simgrid/kernel/resource/NetworkModelIntf.hpp>
#include <simgrid/s4u.hpp>
#include <xbt/config.hpp>

#include <cmath>
#include <exception>
#include <limits>
#include <memory>
#include <stdexcept>
#include <unordered_map>

namespace sg = simgrid::s4u;

namespace threewalls::sim::simgrid_module {

namespace {

class SimGridFlows final : public Engine {
 public:
  explicit SimGridFlows(const PlatformSpec& spec) : spec_(spec) {
    static char arg0[] = "threewalls";
    static char arg1[] = "--log=root.thres:warning";
    static char* argv[] = {arg0, arg1, nullptr};
    int argc = 2;
    engine_ = std::make_unique<sg::Engine>(&argc, argv);
    for (const char* setting : kNetworkModelSettings) sg::Engine::set_config(setting);
    build();
    // The network model's action heap, when it updates lazily: then, once a round of the engine has
    // solved the sharing after the last change of the live flows, the heap's top is the date of the
    // next flow completion, and advance() can answer without entering SimGrid (see there).
    auto* model = dynamic_cast<simgrid::kernel::resource::Model*>(engine_->get_netzone_root()->get_network_model());
    if (model != nullptr && model->is_update_lazy()) network_model_ = model;
    // SimGrid completes an action whose date is within surf/precision of the instant it stops at.
    completion_margin_s_ = 2.0 * simgrid::config::get_value<double>("surf/precision");
  }

  void run(const std::function<void()>& body) override {
    std::exception_ptr error;
    sg::Actor::create("executor", controller_, [this, &body, &error]() {
      try {
        body();
      } catch (...) {
        error = std::current_exception();
      }
      // Never drop a running communication: let what is in flight finish.
      for (const sg::ActivityPtr& a : live_) a->wait();
      live_.clear();
      live_group_.clear();
      remaining_.clear();
    });
    engine_->run();
    if (error) std::rethrow_exception(error);
  }

  [[nodiscard]] double now() const override { return std::max(sg::Engine::get_clock(), ahead_); }

  // Between changes of the set of live flows their rates are constant, and SimGrid (lazy update) has
  // the date each one finishes in its action heap once the sharing is solved: while no flow completes
  // before `until`, entering SimGrid would only move its clock. advance() then solves the sharing
  // itself when the live flows changed since the last solve (fresh_), at SimGrid's clock, as the next
  // round of the engine would, and moves a clock of its own (ahead_) instead of running a round. It
  // runs a round only when a completion is due before `until`, `until` is infinite or a finished flow
  // is not reported yet; starting flows or changing a bandwidth first runs one that brings SimGrid's
  // clock to ahead_ (catch_up).
  // Completion dates do not depend on the clock instants SimGrid stops at in between (lazy update),
  // so the flows' times are the same as with a round at every call.
  double advance(double until, std::vector<std::uint64_t>& completed) override {
    return advance_to(until, completed, /*may_skip_round=*/true);
  }

  // advance(); without may_skip_round it enters SimGrid (a round that moves its clock to `until`).
  double advance_to(double until, std::vector<std::uint64_t>& completed, bool may_skip_round) {
    if (may_skip_round && network_model_ != nullptr && !live_.empty() && fresh_ && std::isfinite(until)) {
      // Solve the new sharing at SimGrid's clock here rather than in a round of the engine: the
      // round's own solve then finds the system unmodified and computes the same heap, so the dates
      // are the ones that round would have computed.
      network_model_->next_occurring_event(sg::Engine::get_clock());
      fresh_ = false;
    }
    if (may_skip_round && network_model_ != nullptr && !live_.empty() && !fresh_ && std::isfinite(until)) {
      const auto& heap = network_model_->get_action_heap();
      // A flow may have finished in SimGrid's last round without being reported yet (a timeout at
      // the same instant): its action has then left the model's started set.
      if (!heap.empty() && heap.top_date() > until + completion_margin_s_ &&
          network_model_->get_started_action_set()->size() == live_.size()) {
        ahead_ = std::max(ahead_, until);
        return now();
      }
    }
    const double now = sg::Engine::get_clock();
    if (live_.empty()) {
      if (std::isfinite(until) && until > now) sg::this_actor::sleep_until(until);
      return sg::Engine::get_clock();
    }
    const double timeout = std::isfinite(until) ? std::max(0.0, until - now) : -1.0;
    // Without may_skip_round (catch_up) no flow completes before `until`: the round waits on none of
    // them (registering each live flow costs SimGrid an allocation per flow and round).
    const bool catching_up = !may_skip_round && network_model_ != nullptr && std::isfinite(until);
    const std::size_t first = catching_up ? live_.size() : first_to_finish(may_skip_round);
    ssize_t i = -1;
    if (catching_up) {
      i = sg::Activity::wait_any_for(no_activities_, timeout);
    } else if (first < live_.size()) {
      next_.assign(1, live_[first]);
      if (sg::Activity::wait_any_for(next_, timeout) == 0) i = static_cast<ssize_t>(first);
      next_.clear();
    } else {
      i = sg::Activity::wait_any_for(live_, timeout);
    }
    // A round of the engine that moved its clock solved the sharing of the flows live before it (a
    // round that did not may not have).
    if (sg::Engine::get_clock() > now) fresh_ = false;
    if (catching_up && network_model_->get_started_action_set()->size() != live_.size()) {
      throw std::logic_error("flow engine: a flow completed before the date SimGrid gave");
    }
    if (i < 0) return sg::Engine::get_clock();
    fresh_ = true;  // the sharing changes: solved by the next advance() or round
    finish(static_cast<std::size_t>(i), completed);
    // Others that finished at the same instant, in the order of live_ (test_any's). The lazy model's
    // started set holds exactly the actions of the flows not finished.
    while (!live_.empty()) {
      if (network_model_ != nullptr && network_model_->get_started_action_set()->size() == live_.size()) break;
      const ssize_t j = sg::Activity::test_any(live_);
      if (j < 0) break;
      finish(static_cast<std::size_t>(j), completed);
    }
    return sg::Engine::get_clock();
  }

  // The index in live_ of the flow that the engine's next round finishes first if it finishes any:
  // the top of the solved action heap (the round pops the heap in order and answers a wait on the
  // first action it finishes), so waiting on that flow alone wakes the executor in the same round,
  // with the same flow, as waiting on all of them. live_.size() when unknown (the sharing is not
  // solved, or a finished flow is not reported yet).
  [[nodiscard]] std::size_t first_to_finish(bool may_skip_round) const {
    if (!may_skip_round || network_model_ == nullptr || fresh_) return live_.size();
    const auto& heap = network_model_->get_action_heap();
    if (heap.empty() || network_model_->get_started_action_set()->size() != live_.size()) return live_.size();
    const auto* activity = heap.top().second->get_activity();
    for (std::size_t k = 0; k < live_.size(); ++k) {
      if (live_[k]->get_impl() == activity) return k;
    }
    return live_.size();
  }

  void start_group(std::uint64_t id, std::span<const PlacedFlow> flows) override {
    if (flows.empty()) throw std::logic_error("start_group: a group without flows");
    if (remaining_.count(id) != 0) throw std::logic_error("start_group: group id already running");
    catch_up();
    fresh_ = true;
    remaining_[id] = flows.size();
    for (const PlacedFlow& f : flows) {
      // Validate before SimGrid sees it: a missing route or a zero-byte comm would abort or hang.
      if (!(f.bytes >= 1.0) || !std::isfinite(f.bytes) || f.links.empty()) {
        throw std::logic_error("start_group: a flow must carry at least one byte on a non-empty route");
      }
      sg::CommPtr c = sg::Comm::sendto_init();
      c->set_payload_size(static_cast<std::uint64_t>(std::llround(f.bytes)));
      c->set_source(host_of(f.src));
      c->set_destination(host_of(f.dst));  // starts the communication
      live_.push_back(std::move(c));
      live_group_.push_back(id);
    }
  }

  [[nodiscard]] bool busy() const override { return !live_.empty(); }

  void set_link_bandwidth(std::uint32_t link, double bytes_per_s) override {
    if (!(bytes_per_s > 0.0)) throw std::logic_error("set_link_bandwidth: bandwidth must be positive");
    catch_up();
    fresh_ = true;
    // A link of a rank the platform was not built for: no flow can use it.
    if (sg::Link* l = links_.at(link)) l->set_bandwidth(bytes_per_s);
  }

  [[nodiscard]] std::vector<std::uint32_t> route(Endpoint src, Endpoint dst) const override {
    std::vector<sg::Link*> links;
    double latency = 0.0;
    host_of(src)->route_to(host_of(dst), links, &latency);
    std::unordered_map<const sg::Link*, std::uint32_t> id_of;
    for (std::uint32_t i = 0; i < links_.size(); ++i) id_of.emplace(links_[i], i);
    std::vector<std::uint32_t> ids;
    for (const sg::Link* l : links) {
      auto it = id_of.find(l);
      ids.push_back(it == id_of.end() ? kNoLink : it->second);
    }
    return ids;
  }

 private:
  // Brings SimGrid's clock to the one advance() moved ahead (no flow completes before it).
  void catch_up() {
    if (ahead_ > sg::Engine::get_clock()) {
      std::vector<std::uint64_t> completed;
      advance_to(ahead_, completed, /*may_skip_round=*/false);
    }
  }

  sg::Host* host_of(Endpoint e) const {
    const auto i = static_cast<std::size_t>(e.index);
    sg::Host* h = nullptr;
    switch (e.kind) {
      case PortKind::gpu: h = gpu_hosts_.at(i); break;
      case PortKind::nic: h = nic_hosts_.at(i); break;
      case PortKind::nic_spine: h = spine_hosts_.at(i); break;
      case PortKind::gpu_pcie: h = pcie_hosts_.at(i); break;
      case PortKind::host: h = node_hosts_.at(i); break;
    }
    if (h == nullptr) {
      throw std::logic_error("flow engine: a flow's end point (port kind " + std::to_string(static_cast<int>(e.kind)) +
                             ", index " + std::to_string(e.index) +
                             ") belongs to a rank or node the platform was not built for");
    }
    return h;
  }

  void build() {
    const int world = spec_.world;
    const auto ranks = static_cast<std::size_t>(world);
    links_.assign(spec_.bandwidth_bytes_per_s.size(), nullptr);
    gpu_hosts_.assign(ranks, nullptr);
    nic_hosts_.assign(ranks, nullptr);
    spine_hosts_.assign(ranks, nullptr);
    pcie_hosts_.assign(ranks, nullptr);
    node_hosts_.assign(static_cast<std::size_t>(spec_.nodes), nullptr);
    if (spec_.node_of_rank.size() != spec_.ranks.size()) throw std::logic_error("PlatformSpec: one node per rank");
    auto duplex = [&](sg::NetZone* z, const std::string& name, LinkKind up, LinkKind down, std::size_t rank) {
      const std::uint32_t up_id = spec_.rank_links[rank][static_cast<std::size_t>(up)];
      const std::uint32_t down_id = spec_.rank_links[rank][static_cast<std::size_t>(down)];
      sg::SplitDuplexLink* l = z->create_split_duplex_link(name, spec_.bandwidth_bytes_per_s[up_id]);
      l->set_latency(0.0);
      l->get_link_up()->set_bandwidth(spec_.bandwidth_bytes_per_s[up_id]);
      l->get_link_down()->set_bandwidth(spec_.bandwidth_bytes_per_s[down_id]);
      links_[up_id] = l->get_link_up();
      links_[down_id] = l->get_link_down();
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
    for (std::size_t k = 0; k < spec_.ranks.size(); ++k) {
      const int n = spec_.node_of_rank[k];
      if (n < 0 || n >= spec_.nodes) throw std::logic_error("PlatformSpec: a node out of range");
      if (node_hosts_[static_cast<std::size_t>(n)] != nullptr) continue;
      sg::Host* mem = pcie->create_host("host_memory." + std::to_string(n), 1e9);
      pcie->add_route(mem->get_netpoint(), nullptr, nullptr, nullptr, {}, true);
      node_hosts_[static_cast<std::size_t>(n)] = mem;
    }
    for (const int rank : spec_.ranks) {
      if (rank < 0 || rank >= world) throw std::logic_error("PlatformSpec: a rank out of range");
      const auto ri = static_cast<std::size_t>(rank);
      if (gpu_hosts_[ri] != nullptr) throw std::logic_error("PlatformSpec: a rank listed twice");
      const std::string rs = std::to_string(ri);
      sg::Host* g = nvlink->create_host("gpu." + rs, 1e9);
      auto* nv = duplex(nvlink, "nvlink." + rs, LinkKind::nvlink_up, LinkKind::nvlink_down, ri);
      nvlink->add_route(g->get_netpoint(), nullptr, nullptr, nullptr, {{nv, sg::LinkInRoute::Direction::UP}}, true);
      gpu_hosts_[ri] = g;
      sg::Host* ph = pcie->create_host("pcie_port." + rs, 1e9);
      auto* pl = duplex(pcie, "pcie." + rs, LinkKind::pcie_up, LinkKind::pcie_down, ri);
      pcie->add_route(ph->get_netpoint(), nullptr, nullptr, nullptr, {{pl, sg::LinkInRoute::Direction::UP}}, true);
      pcie_hosts_[ri] = ph;
      sg::Host* nh = nic->create_host("nic." + rs, 1e9);
      auto* nl = duplex(nic, "nic." + rs, LinkKind::nic_up, LinkKind::nic_down, ri);
      nic->add_route(nh->get_netpoint(), nullptr, nullptr, nullptr, {{nl, sg::LinkInRoute::Direction::UP}}, true);
      nic_hosts_[ri] = nh;
      sg::Host* sh = spine->create_host("nic_spine." + rs, 1e9);
      auto* sl = duplex(spine, "spine." + rs, LinkKind::spine_up, LinkKind::spine_down, ri);
      spine->add_route(sh->get_netpoint(), nullptr, nullptr, nullptr,
                       {{nl, sg::LinkInRoute::Direction::UP}, {sl, sg::LinkInRoute::Direction::UP}}, true);
      spine_hosts_[ri] = sh;
    }
    nvlink->seal();
    pcie->seal();
    nic->seal();
    spine->seal();
    controller_ = root->create_host("controller", 1e9);
    root->seal();
  }

  void finish(std::size_t i, std::vector<std::uint64_t>& completed) {
    const std::uint64_t group = live_group_[i];
    live_[i] = std::move(live_.back());
    live_.pop_back();
    live_group_[i] = live_group_.back();
    live_group_.pop_back();
    auto it = remaining_.find(group);
    if (--it->second == 0) {
      remaining_.erase(it);
      completed.push_back(group);
    }
  }

  PlatformSpec spec_;
  std::unique_ptr<sg::Engine> engine_;
  std::vector<sg::Link*> links_;  // by platform link id
  std::vector<sg::Host*> gpu_hosts_, nic_hosts_, spine_hosts_, pcie_hosts_, node_hosts_;
  sg::Host* controller_ = nullptr;
  std::vector<sg::ActivityPtr> live_;  // the flows' comms, as Activity::wait_any_for takes them
  const std::vector<sg::ActivityPtr> no_activities_;
  std::vector<sg::ActivityPtr> next_;  // the one flow a round waits on (first_to_finish)
  std::vector<std::uint64_t> live_group_;
  std::unordered_map<std::uint64_t, std::size_t> remaining_;  // flows left per group
  // Lazy network model (nullptr: advance() always enters SimGrid).
  simgrid::kernel::resource::Model* network_model_ = nullptr;
  bool fresh_ = true;   // live flows changed since SimGrid last solved the sharing
  double ahead_ = 0.0;  // the clock advance() reached without SimGrid
  // A completion this close after `until` is left to SimGrid (it compares dates with a precision).
  double completion_margin_s_ = 0.0;
};

}  // namespace

}  // namespace threewalls::sim::simgrid_module

extern "C" __attribute__((visibility("default"))) threewalls::sim::simgrid_module::Engine* threewalls_simgrid_create(
    const threewalls::sim::simgrid_module::PlatformSpec& spec, std::string& error) {
  try {
    return new threewalls::sim::simgrid_module::SimGridFlows(spec);
  } catch (const std::exception& e) {
    error = e.what();
  } catch (...) {
    error = "an exception that is not a std::exception";
  }
  return nullptr;
}
