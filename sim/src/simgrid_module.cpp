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
// The star zones are FlatStarZone (SimGrid's StarZone with a route lookup that does not allocate).
// Four large zones rather than one per node: SimGrid 3.32 looks names up zone by zone, so building
// is quadratic in the number of zones.
#include "simgrid_module.hpp"
#include "threewalls/sim/simgrid_network.hpp"  // kNetworkModelSettings

#include <simgrid/kernel/resource/Model.hpp>
#include <simgrid/kernel/resource/NetworkModelIntf.hpp>
#include <simgrid/kernel/routing/NetPoint.hpp>
#include <simgrid/kernel/routing/StarZone.hpp>
#include <simgrid/s4u.hpp>
#include <xbt/config.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <exception>
#include <limits>
#include <memory>
#include <stdexcept>
#include <unordered_map>

namespace sg = simgrid::s4u;

namespace threewalls::sim::simgrid_module {

namespace {

// A star zone (SimGrid's StarZone: a host's route is its up links, then the destination's down
// links, a link listed twice taken once) whose routes are found without allocating. StarZone's
// get_local_route, run at every communication's start, collects a route's links through an
// std::unordered_set; this zone keeps each host's up and down links in a vector by net point id
// (from the same add_route calls, which StarZone still validates and records) and appends them in
// the same order, skipping a link already appended by this lookup, adding each link's latency.
// Only the routes build() adds: symmetrical, from a host to everyone.
class FlatStarZone final : public simgrid::kernel::routing::StarZone {
 public:
  using NetPoint = simgrid::kernel::routing::NetPoint;

  explicit FlatStarZone(const std::string& name) : StarZone(name) {}

  void add_route(NetPoint* src, NetPoint* dst, NetPoint* gw_src, NetPoint* gw_dst,
                 const std::vector<sg::LinkInRoute>& link_list, bool symmetrical) override {
    StarZone::add_route(src, dst, gw_src, gw_dst, link_list, symmetrical);
    if (src == nullptr || dst != nullptr || gw_src != nullptr || gw_dst != nullptr || !symmetrical) {
      throw std::logic_error("FlatStarZone: only symmetrical routes from a host to everyone");
    }
    if (ends_.size() <= src->id()) ends_.resize(src->id() + 1);
    Ends& e = ends_[src->id()];
    e.up.clear();
    e.down.clear();
    // Up: the links in order (a split-duplex link's UP side for UP); down: the reverse route, the
    // links in reverse order with the other side of each split-duplex link.
    for (const sg::LinkInRoute& l : link_list) e.up.push_back(side(l, /*back=*/false));
    for (auto it = link_list.rbegin(); it != link_list.rend(); ++it) e.down.push_back(side(*it, /*back=*/true));
  }

  void get_local_route(const NetPoint* src, const NetPoint* dst, simgrid::kernel::routing::Route* route,
                       double* latency) override {
    if (src == dst) {
      StarZone::get_local_route(src, dst, route, latency);  // loopback: never a flow of ours
      return;
    }
    const std::size_t first = route->link_list_.size();
    route->link_list_.reserve(first + ends_of(src->id()).up.size() + ends_of(dst->id()).down.size());
    append(ends_of(src->id()).up, first, route, latency);
    append(ends_of(dst->id()).down, first, route, latency);
  }

 private:
  struct Link {
    simgrid::kernel::resource::StandardLinkImpl* impl;
    const sg::Link* link;
  };
  struct Ends {
    std::vector<Link> up, down;
  };

  static Link side(const sg::LinkInRoute& l, bool back) {
    const sg::Link* link = l.get_link();
    if (link->get_sharing_policy() == sg::Link::SharingPolicy::SPLITDUPLEX) {
      const auto* sd = dynamic_cast<const sg::SplitDuplexLink*>(link);
      if (sd == nullptr) throw std::logic_error("FlatStarZone: a split-duplex link that is not a SplitDuplexLink");
      if (l.get_direction() != sg::LinkInRoute::Direction::UP &&
          l.get_direction() != sg::LinkInRoute::Direction::DOWN) {
        throw std::logic_error("FlatStarZone: a split-duplex link without a direction");
      }
      const bool up = (l.get_direction() == sg::LinkInRoute::Direction::UP) != back;
      link = up ? sd->get_link_up() : sd->get_link_down();
    }
    return {link->get_impl(), link};
  }

  [[nodiscard]] const Ends& ends_of(unsigned long id) const {
    static const Ends kNone;
    return id < ends_.size() ? ends_[id] : kNone;
  }

  // Appends `links` to the route, each link once among those appended since `first`.
  static void append(const std::vector<Link>& links, std::size_t first, simgrid::kernel::routing::Route* route,
                     double* latency) {
    auto& out = route->link_list_;
    for (const Link& l : links) {
      if (std::find(out.begin() + static_cast<std::ptrdiff_t>(first), out.end(), l.impl) != out.end()) continue;
      out.push_back(l.impl);
      if (latency != nullptr) *latency += l.link->get_latency();
    }
  }

  std::vector<Ends> ends_;  // by net point id
};

sg::NetZone* create_flat_star_zone(const std::string& name) { return (new FlatStarZone(name))->get_iface(); }

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
    // The network model, which must update lazily: once the sharing is solved after the last change
    // of the live flows, its action heap's top is the date of the next flow completion (advance()).
    auto* model = dynamic_cast<simgrid::kernel::resource::Model*>(engine_->get_netzone_root()->get_network_model());
    if (model != nullptr && model->is_update_lazy()) network_model_ = model;
    // SimGrid completes an action whose date is within surf/precision of the instant it stops at.
    precision_s_ = simgrid::config::get_value<double>("surf/precision");
    completion_margin_s_ = 2.0 * precision_s_;
    clock_ = sg::Engine::get_clock();
    if (network_model_ == nullptr)
      throw std::logic_error("flow engine: SimGrid's network model does not update lazily");
  }

  // The executor runs in SimGrid's maestro, not in an actor: advance() runs the engine's rounds
  // itself (Engine::run_until), without a context switch, a wait simcall or a timer per round.
  void run(const std::function<void()>& body) override {
    engine_->seal_platform();
    std::exception_ptr error;
    try {
      body();
    } catch (...) {
      error = std::current_exception();
    }
    // Never drop a running communication: let what is in flight finish.
    if (sg_live_ > 0) engine_->run();
    clock_ = sg::Engine::get_clock();
    live_.clear();
    sg_live_ = 0;
    solo_done_ = 0;
    link_use_.assign(link_use_.size(), 0);
    remaining_.clear();
    if (error) std::rethrow_exception(error);
  }

  [[nodiscard]] double now() const override { return std::max(clock_, ahead_); }

  // Between changes of the set of live flows their rates are constant, and SimGrid's lazy network
  // model has the date each one finishes in its action heap once the sharing is solved. advance()
  // solves it when the live flows changed since the last solve (fresh_), at SimGrid's clock (what a
  // round of the engine does first; the round then finds the sharing unmodified). While no flow
  // completes before `until` it moves a clock of its own (ahead_) instead of running a round; starting
  // flows or changing a bandwidth first runs a round that brings SimGrid's clock to ahead_
  // (catch_up). Completion dates do not depend on the clock instants SimGrid stops at in between
  // (lazy update).
  //
  // A round is the one an actor waiting on the live flows with the timeout `until` would get: it ends
  // at the earlier of the timeout's date and the heap's top, and when it reaches the timeout's date
  // the flows it finished are reported by the next call (SimGrid runs an expired timer before the
  // ended actions), in the order of live_; otherwise the flow at the heap's top first (the round
  // finishes the actions in heap order), then the others in the order of live_. An idle engine moves
  // its clock as a sleep of the actor would (SimGrid stretches a sleep to at least surf/precision).
  double advance(double until, std::vector<std::uint64_t>& completed) override {
    return advance_to(until, completed, /*may_skip_round=*/true);
  }

  // advance(); without may_skip_round it runs a round to `until` (catch_up: no flow completes before).
  //
  // Solo flows (start_group) are in that round as SimGrid would have them: the heap's top is the
  // earlier of SimGrid's and the earliest solo end (SimGrid's first on a tie), a round to a date
  // finishes the solo flows whose end is within surf/precision of it, as SimGrid finishes its
  // actions, and a round without a SimGrid flow is ahead_ moving (nothing in SimGrid needs it).
  double advance_to(double until, std::vector<std::uint64_t>& completed, bool may_skip_round) {
    if (live_.empty()) {
      // Idle: the clock moves as the sleep of an actor would, from where advance() has brought it.
      const double base = now();
      if (std::isfinite(until) && until > base) run_until(base + std::max(until - base, precision_s_));
      return now();
    }
    if (sg_finished() || solo_done_ > 0) {
      // Flows finished in the last round, which reached its timeout's date.
      report_finished(live_.size(), completed);
      return now();
    }
    double top = kInf;
    std::size_t first = live_.size();
    if (sg_live_ > 0) {
      if (fresh_) {
        network_model_->next_occurring_event(clock_);
        fresh_ = false;
      }
      const auto& heap = network_model_->get_action_heap();
      if (heap.empty()) throw std::logic_error("flow engine: live flows without a completion date");
      top = heap.top_date();
      if (may_skip_round) first = index_of(heap.top().second->get_activity());
    }
    const std::size_t solo = earliest_solo();
    if (solo < live_.size() && live_[solo].finish < top) {
      top = live_[solo].finish;
      if (may_skip_round) first = solo;
    }
    if (may_skip_round && std::isfinite(until) && top > until + completion_margin_s_) {
      ahead_ = std::max(ahead_, until);
      return now();
    }
    if (!may_skip_round) first = live_.size();
    double timer = kInf;
    double t = 0.0;
    bool finished = false;
    if (sg_live_ > 0) {
      // The date the timeout of a wait for `until` would have (SimGrid's Timer::set(clock + timeout)).
      const double now = clock_;
      if (std::isfinite(until)) timer = now + std::max(0.0, until - now);
      run_until(std::min(timer, top));
      t = clock_;
      finished = sg_finished();
    } else {
      if (std::isfinite(until)) timer = std::max(until, now());
      t = std::min(timer, top);
      ahead_ = std::max(ahead_, t);
    }
    finished = finish_solos(t) || finished;
    if (!finished) return now();
    if (!may_skip_round) throw std::logic_error("flow engine: a flow completed before the date SimGrid gave");
    if (t >= timer) return now();  // reported by the next call
    report_finished(first, completed);
    return now();
  }

 private:
  static constexpr double kInf = std::numeric_limits<double>::infinity();

  // Reports the finished flows: live_[first] first when it is one, then the others in the order of
  // live_ (as it changes while they are taken out).
  void report_finished(std::size_t first, std::vector<std::uint64_t>& completed) {
    if (first < live_.size() && finished_flow(first)) finish(first, completed);
    while (sg_finished() || solo_done_ > 0) {
      std::size_t k = 0;
      while (k < live_.size() && !finished_flow(k)) ++k;
      if (k == live_.size()) throw std::logic_error("flow engine: a finished flow SimGrid does not report");
      finish(k, completed);
    }
  }

  // Whether SimGrid has finished flows not yet reported.
  [[nodiscard]] bool sg_finished() const {
    return sg_live_ > 0 && network_model_->get_started_action_set()->size() != sg_live_;
  }

  [[nodiscard]] bool finished_flow(std::size_t k) const {
    return live_[k].comm ? live_[k].comm->test() : live_[k].done;
  }

  // The live solo flow that ends first (the first in live_ on a tie), or live_.size().
  [[nodiscard]] std::size_t earliest_solo() const {
    std::size_t best = live_.size();
    for (std::size_t k = 0; k < live_.size(); ++k) {
      if (!live_[k].comm && !live_[k].done && (best == live_.size() || live_[k].finish < live_[best].finish)) best = k;
    }
    return best;
  }

  // A round that stopped at `t` finishes the solo flows that end within surf/precision of it (SimGrid's
  // double_equals on the action heap's dates); whether it finished one.
  bool finish_solos(double t) {
    bool any = false;
    for (Live& l : live_) {
      if (l.comm || l.done || !(l.finish - t < precision_s_)) continue;
      l.done = true;
      ++solo_done_;
      for (std::uint8_t j = 0; j < l.num_links; ++j) --link_use_[l.links[j]];
      any = true;
    }
    return any;
  }

  // The index in live_ of the flow of a network action (live_.size() when none).
  [[nodiscard]] std::size_t index_of(const simgrid::kernel::activity::ActivityImpl* activity) const {
    for (std::size_t k = 0; k < live_.size(); ++k) {
      if (live_[k].comm && live_[k].comm->get_impl() == activity) return k;
    }
    return live_.size();
  }

 public:
  // A flow whose links no other live flow uses when it starts runs solo: out of SimGrid, ending at
  // the date SimGrid would give it (its start + its bytes / the narrowest link's bandwidth, the
  // max-min share of a flow alone: CM02 without a TCP window or cross traffic, links without
  // latency). It enters SimGrid, with the bytes it has left, once a flow starts on one of its links
  // or that link's bandwidth changes (docs/simulator.md, "Flows alone").
  void start_group(std::uint64_t id, std::span<const PlacedFlow> flows) override {
    if (flows.empty()) throw std::logic_error("start_group: a group without flows");
    if (id >= kMaxGroups) throw std::logic_error("start_group: a group id from 2^28 up");
    if (id >= remaining_.size()) remaining_.resize(std::max<std::size_t>(id + 1, 2 * remaining_.size()), 0);
    if (remaining_[id] != 0) throw std::logic_error("start_group: group id already running");
    remaining_[id] = flows.size();
    if (link_use_.size() < links_.size()) link_use_.resize(links_.size(), 0);
    bool caught_up = false;
    for (const PlacedFlow& f : flows) {
      // Validate before SimGrid sees it: a missing route or a zero-byte comm would abort or hang.
      if (!(f.bytes >= 1.0) || !std::isfinite(f.bytes) || f.links.empty()) {
        throw std::logic_error("start_group: a flow must carry at least one byte on a non-empty route");
      }
      if (f.links.size() > kRouteLinks) throw std::logic_error("start_group: a route of more links than a star's");
      Live l;
      l.group = id;
      l.src = f.src;
      l.dst = f.dst;
      for (const std::uint32_t link : f.links) {
        if (link >= links_.size() || links_[link] == nullptr) {
          throw std::logic_error("start_group: a flow on a link the platform was not built for");
        }
        l.links[l.num_links++] = link;
      }
      host_of(f.src);  // the end points exist (it throws otherwise)
      host_of(f.dst);
      const auto bytes = static_cast<std::uint64_t>(std::llround(f.bytes));
      const bool alone =
          std::all_of(f.links.begin(), f.links.end(), [&](std::uint32_t k) { return link_use_[k] == 0; });
      if (!alone) {
        if (!caught_up) {
          catch_up();
          caught_up = true;
        }
        for (const std::uint32_t link : f.links) promote_solos_on(link);  // before this flow counts
      }
      for (const std::uint32_t link : f.links) ++link_use_[link];
      if (alone && spec_.solo_flows) {
        l.start = now();
        l.bytes = static_cast<double>(bytes);
        l.rate = kInf;
        for (const std::uint32_t link : f.links) l.rate = std::min(l.rate, links_[link]->get_bandwidth());
        l.finish = l.start + l.bytes / l.rate;
        live_.push_back(l);
        continue;
      }
      if (!caught_up) {
        catch_up();
        caught_up = true;
      }
      l.comm = start_comm(f.src, f.dst, bytes);
      live_.push_back(std::move(l));
    }
  }

  [[nodiscard]] bool busy() const override { return !live_.empty(); }

  void set_link_bandwidth(std::uint32_t link, double bytes_per_s) override {
    if (!(bytes_per_s > 0.0)) throw std::logic_error("set_link_bandwidth: bandwidth must be positive");
    catch_up();
    fresh_ = true;
    promote_solos_on(link);
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
  // One round of the engine (what alone moves SimGrid's clock), to `date`.
  void run_until(double date) {
    engine_->run_until(date);
    clock_ = sg::Engine::get_clock();
  }

  // Brings SimGrid's clock to the one advance() moved ahead (no flow completes before it).
  void catch_up() {
    if (ahead_ > clock_ && sg_live_ == 0) {
      run_until(ahead_);  // nothing in SimGrid to finish
      return;
    }
    if (ahead_ > clock_) {
      std::vector<std::uint64_t> completed;
      advance_to(ahead_, completed, /*may_skip_round=*/false);
      if (!completed.empty()) throw std::logic_error("flow engine: a flow completed before the date SimGrid gave");
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
    auto* nvlink = create_flat_star_zone("nvlink");
    nvlink->set_parent(root);
    auto* pcie = create_flat_star_zone("pcie");
    pcie->set_parent(root);
    auto* nic = create_flat_star_zone("nic");
    nic->set_parent(root);
    auto* spine = create_flat_star_zone("spine");
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
    root->seal();
  }

  void finish(std::size_t i, std::vector<std::uint64_t>& completed) {
    Live& l = live_[i];
    const std::uint64_t group = l.group;
    if (l.comm) {
      --sg_live_;
      fresh_ = true;  // the sharing changes: solved by the next advance()
      for (std::uint8_t j = 0; j < l.num_links; ++j) --link_use_[l.links[j]];
    } else {
      --solo_done_;  // its links were given back when it finished
    }
    live_[i] = std::move(live_.back());
    live_.pop_back();
    if (--remaining_[group] == 0) completed.push_back(group);
  }

  // A SimGrid communication of `bytes` between two end points, started now (SimGrid's clock).
  sg::ActivityPtr start_comm(Endpoint src, Endpoint dst, std::uint64_t bytes) {
    sg::CommPtr c = sg::Comm::sendto_init();
    c->set_payload_size(bytes);
    c->set_source(host_of(src));
    c->set_destination(host_of(dst));  // starts the communication
    ++sg_live_;
    fresh_ = true;
    return c;
  }

  // The solo flows on `link` enter SimGrid with the bytes they have left (at SimGrid's clock, caught
  // up), where they keep their place in live_; one with less than a byte left ends solo.
  void promote_solos_on(std::uint32_t link) {
    if (link >= link_use_.size() || link_use_[link] == 0) return;
    for (Live& l : live_) {
      if (l.comm || l.done) continue;
      if (std::find(l.links.begin(), l.links.begin() + l.num_links, link) == l.links.begin() + l.num_links) continue;
      const double left = l.bytes - l.rate * (clock_ - l.start);
      if (!(left >= 1.0)) continue;
      l.comm = start_comm(l.src, l.dst, static_cast<std::uint64_t>(std::llround(left)));
    }
  }

  PlatformSpec spec_;
  std::unique_ptr<sg::Engine> engine_;
  std::vector<sg::Link*> links_;  // by platform link id
  std::vector<sg::Host*> gpu_hosts_, nic_hosts_, spine_hosts_, pcie_hosts_, node_hosts_;
  // A live flow: a SimGrid communication (comm), or solo (no comm; start_group): its end points,
  // links, start, bytes, rate and the date it ends, and whether a round has finished it (reported by
  // the next advance()).
  static constexpr std::size_t kRouteLinks = 4;  // the longest route: up and down through a spine
  struct Live {
    sg::ActivityPtr comm;
    std::uint64_t group = 0;
    Endpoint src{};
    Endpoint dst{};
    std::array<std::uint32_t, kRouteLinks> links{};
    std::uint8_t num_links = 0;
    double start = 0.0;
    double bytes = 0.0;
    double rate = 0.0;
    double finish = 0.0;
    bool done = false;
  };
  std::vector<Live> live_;     // in start order, as SimGrid reports its actions
  std::size_t sg_live_ = 0;    // of them in SimGrid (finished ones included until reported)
  std::size_t solo_done_ = 0;  // solo flows finished, not reported
  std::vector<int> link_use_;  // live flows per platform link (a finished solo flow's given back)
  // Flows left per group id (0: not running), as long as the largest id yet: ids are the executor's
  // instance indices (a step's collective and point-to-point instances), below kMaxGroups.
  static constexpr std::uint64_t kMaxGroups = std::uint64_t{1} << 28;
  std::vector<std::size_t> remaining_;
  // Lazy network model (nullptr: advance() always enters SimGrid).
  simgrid::kernel::resource::Model* network_model_ = nullptr;
  bool fresh_ = true;   // live flows changed since SimGrid last solved the sharing
  double ahead_ = 0.0;  // the clock advance() reached without SimGrid
  double clock_ = 0.0;  // SimGrid's clock (sg::Engine::get_clock()), read after each run of the engine
  // A completion this close after `until` is left to SimGrid (it compares dates with a precision).
  double completion_margin_s_ = 0.0;
  double precision_s_ = 0.0;  // surf/precision
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
