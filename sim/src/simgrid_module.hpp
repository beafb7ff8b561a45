#pragma once
// The seam between SimGridEngine (simgrid_network.cpp, in threewalls_sim) and the shared module
// libthreewalls_simgrid.so (simgrid_module.cpp, the only code that links SimGrid). The module is
// loaded with dlopen when a flow-fidelity simulation starts, so that no other command maps SimGrid
// and the libraries it pulls in (ns-3 among them). Both sides are built from one tree by one compiler:
// C++ types cross the seam. The module uses no threewalls library, only the header-only types below.
#include <array>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "threewalls/sim/flows.hpp"
#include "threewalls/sim/platform.hpp"

namespace threewalls::sim::simgrid_module {

// What the module builds: Platform's links, as numbers, for the ranks listed.
struct PlatformSpec {
  int world = 0;
  int nodes = 0;
  std::vector<double> bandwidth_bytes_per_s;  // by platform link id
  // By rank: the platform link id of each LinkKind (index = the LinkKind's value).
  std::vector<std::array<std::uint32_t, kLinkKinds>> rank_links;
  // The ranks whose ports (hosts and links) are built, each with its node (whose host memory is
  // built); a flow between other ports is a caller's bug (std::logic_error).
  std::vector<int> ranks;
  std::vector<int> node_of_rank;  // parallel to ranks
  // Flows alone on their links run outside SimGrid until another flow shares one (the module's
  // start_group); false: every flow is a SimGrid communication (the check of that shortcut).
  bool solo_flows = true;
};

// The flow engine the module implements (SimGridEngine's contract, simgrid_network.hpp).
class Engine {
 public:
  virtual ~Engine() = default;
  virtual void run(const std::function<void()>& body) = 0;
  [[nodiscard]] virtual double now() const = 0;
  virtual double advance(double until, std::vector<std::uint64_t>& completed) = 0;
  virtual void start_group(std::uint64_t id, std::span<const PlacedFlow> flows) = 0;
  [[nodiscard]] virtual bool busy() const = 0;
  virtual void set_link_bandwidth(std::uint32_t link, double bytes_per_s) = 0;
  // SimGrid's route between two end points as platform link ids (kNoLink: a link SimGrid has that
  // the platform does not).
  [[nodiscard]] virtual std::vector<std::uint32_t> route(Endpoint src, Endpoint dst) const = 0;
};
inline constexpr std::uint32_t kNoLink = 0xFFFFFFFFU;

// The module's one exported symbol: builds the platform and returns the engine (owned by the caller),
// or nullptr with the reason in `error`.
using CreateFn = Engine* (*)(const PlatformSpec& spec, std::string& error);
inline constexpr const char* kCreateSymbol = "threewalls_simgrid_create";
inline constexpr const char* kModuleFile = "libthreewalls_simgrid.so";

}  // namespace threewalls::sim::simgrid_module
