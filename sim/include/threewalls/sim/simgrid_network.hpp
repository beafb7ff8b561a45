#pragma once
// The flow engine on SimGrid 3.32 (the only part of threewalls that includes SimGrid). It builds the
// platform of platform.hpp with SimGrid's C++ API and runs the executor's flows on it with the
// network model settings of kNetworkModelSettings (docs/simulator.md, "Network model").
//
// SimGrid keeps global state: one engine per process. Constructing a second SimGridEngine in a
// process throws SystemError; tests fork a child per simulation. Destroying a SimGridEngine leaves
// SimGrid's engine and platform to the end of the process (no teardown work per GPU).
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "threewalls/core/jsonl.hpp"
#include "threewalls/sim/executor.hpp"
#include "threewalls/sim/platform.hpp"

namespace threewalls::sim {

// Network model settings (SimGrid --cfg) that make flow times the closed forms of max-min sharing:
// CM02 without TCP window (gamma 0) and without cross-traffic; link latencies are 0 in SimGrid and
// latency terms are added by the executor.
inline constexpr const char* kNetworkModelSettings[] = {"network/model:CM02", "network/crosstraffic:0",
                                                        "network/TCP-gamma:0"};

// Loads the SimGrid module now, as the first SimGridEngine would (throws SystemError where it cannot):
// a process that forks children which each run a flow simulation calls it first, so that the children
// share the mapped and relocated libraries instead of loading them each. Creates no engine.
void preload_simgrid_module();

class SimGridEngine final : public FlowEngine {
 public:
  // Builds the SimGrid platform: the ports of every GPU, or of the GPUs `ranks` only (any order,
  // repeats allowed; e.g. Executor::flow_ranks), whose hosts and links are then all the platform
  // holds, so that a GPU no flow can reach costs nothing. A flow to or from another GPU's port is a
  // caller's bug (std::logic_error). Throws SystemError when a SimGrid engine already exists in
  // this process.
  // `solo_flows` false: every flow is a SimGrid communication, none runs alone outside it
  // (docs/simulator.md, "Flows alone"; the check of that shortcut).
  explicit SimGridEngine(const Platform& platform);
  SimGridEngine(const Platform& platform, std::vector<int> ranks, bool solo_flows = true);
  ~SimGridEngine() override;
  SimGridEngine(const SimGridEngine&) = delete;
  SimGridEngine& operator=(const SimGridEngine&) = delete;

  // Runs `body` inside a SimGrid actor (flows start and complete only there) until it returns and
  // every flow it started has finished. An exception thrown by `body` is rethrown here once the
  // flows in flight have completed (SimGrid must not lose a running communication).
  void run(const std::function<void()>& body);

  [[nodiscard]] double now() const override;
  double advance(double until, std::vector<std::uint64_t>& completed) override;
  void start_group(std::uint64_t id, std::span<const PlacedFlow> flows) override;
  [[nodiscard]] bool busy() const override;
  void set_link_bandwidth(std::uint32_t link, BytesPerSecond bw) override;

  // SimGrid's route between two end points, as link names of platform.hpp ("nic_up.3"), for tests
  // that check the SimGrid platform against the pure description.
  [[nodiscard]] std::vector<std::string> route_names(Endpoint src, Endpoint dst) const;

  // The network model settings, for the run header.
  static OrderedJson settings();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace threewalls::sim
