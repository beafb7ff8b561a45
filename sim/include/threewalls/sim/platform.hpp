#pragma once
// The simulated machine, as a pure description (no SimGrid): which links exist, their bandwidth and
// latency, and the links a transfer crosses. simgrid_network.cpp builds exactly these links and routes
// in SimGrid; the analytic fidelity and the flow planner use this description directly. Equations and
// the topology are documented in docs/simulator.md ("Platform").
//
// Topology, per node of `gpus_per_node` GPUs:
//   * NVLink domain: every GPU has one NVLink port (per direction `nvlink_bandwidth`) into a
//     non-blocking NVSwitch. GPU a -> GPU b on the same node: [nvlink_up a, nvlink_down b].
//   * PCIe: every GPU has its own PCIe link to the host (per direction `pcie_bandwidth`).
//     Host -> GPU r: [pcie_down r]; GPU r -> host: [pcie_up r]. Host memory is not a bottleneck.
//   * One NIC per GPU (per direction `nic_bandwidth`) into a two-level fat tree (leaf switches and a
//     non-blocking spine). `rail_optimized`: the leaf of GPU (node n, local index i) is rail i, group
//     n / leaf_switch_ports (a leaf joins the i-th NICs of leaf_switch_ports nodes); `fat_tree`: the
//     leaf of rank r is r / leaf_switch_ports (consecutive NICs). A leaf's uplinks carry
//     (NICs on the leaf) x nic_bandwidth / oversubscription; each NIC gets its share of them, a
//     spine port of nic_bandwidth / oversubscription per direction (per-port share: exact when the
//     NICs of a leaf carry the same traffic, which the representative placement assumes).
//     GPU a -> GPU b on another node under the same leaf: [nic_up a, nic_down b]; under another
//     leaf: [nic_up a, spine_up a, spine_down b, nic_down b]. GPUDirect RDMA: inter-node traffic
//     does not cross the host's PCIe link.
#include <cstdint>
#include <string>
#include <vector>

#include "threewalls/core/jsonl.hpp"
#include "threewalls/core/units.hpp"
#include "threewalls/scenarios/scenario.hpp"

namespace threewalls::sim {

// One direction of a link, indexed by rank.
enum class LinkKind : std::uint8_t { nvlink_up, nvlink_down, pcie_up, pcie_down, nic_up, nic_down, spine_up, spine_down };
inline constexpr int kLinkKinds = 8;
const char* to_string(LinkKind k);

struct Link {
  LinkKind kind = LinkKind::nvlink_up;
  int index = 0;
  BytesPerSecond bandwidth;
  Seconds latency;
};

// A transfer's end point. A GPU reaches other GPUs of its node through its NVLink port (`gpu`),
// GPUs of other nodes under its leaf through its NIC (`nic`), under other leaves through its NIC and
// spine port (`nic_spine`), and host memory through PCIe (`gpu_pcie` <-> `host`).
enum class PortKind : std::uint8_t { gpu, nic, nic_spine, gpu_pcie, host };
struct Endpoint {
  PortKind kind = PortKind::gpu;
  int index = 0;  // rank; node for `host`
  friend bool operator==(const Endpoint&, const Endpoint&) = default;
};

class Platform {
 public:
  // Throws InputError when the cluster cannot be built (no GPUs, non-positive bandwidth).
  explicit Platform(const scenarios::ClusterSpec& cluster);

  [[nodiscard]] int world() const { return world_; }
  [[nodiscard]] int gpus_per_node() const { return gpus_per_node_; }
  [[nodiscard]] int nodes() const { return nodes_; }
  [[nodiscard]] int leaves() const { return leaves_; }
  [[nodiscard]] int node_of(int rank) const { return rank / gpus_per_node_; }
  [[nodiscard]] int leaf_of(int rank) const;
  [[nodiscard]] scenarios::Topology topology() const { return topology_; }
  [[nodiscard]] Seconds switch_latency() const { return switch_latency_; }

  [[nodiscard]] const std::vector<Link>& links() const { return links_; }
  [[nodiscard]] std::uint32_t link_id(LinkKind kind, int index) const;
  [[nodiscard]] std::string link_name(std::uint32_t id) const;  // "nvlink_up.3", "spine_down.0"

  // The end points of a GPU-to-GPU transfer: NVLink ports on one node, NICs across nodes.
  [[nodiscard]] std::pair<Endpoint, Endpoint> gpu_endpoints(int src_rank, int dst_rank) const;
  // Links crossed from `src` to `dst`, in order (appended to `out`). Empty when src == dst. Throws
  // std::logic_error for pairs that have no route (an NVLink port of another node, a NIC to a
  // PCIe port): callers never hand such a pair to SimGrid.
  void route(Endpoint src, Endpoint dst, std::vector<std::uint32_t>& out) const;
  // Sum of the link latencies on the route plus switch latency per switch crossed (NVSwitch is
  // part of nvlink_latency; one leaf: 1 switch, leaf-spine-leaf: 3).
  [[nodiscard]] Seconds route_latency(Endpoint src, Endpoint dst) const;
  // Bottleneck bandwidth of the route (infinite for an empty route).
  [[nodiscard]] BytesPerSecond route_bandwidth(Endpoint src, Endpoint dst) const;

  // Divides the bandwidth of `rank`'s link(s) of `which` (both directions) by `factor`.
  void slow_link(int rank, scenarios::SlowLink which, double factor);
  void set_link_bandwidth(std::uint32_t id, BytesPerSecond bw) { links_[id].bandwidth = bw; }

  // The platform as written into the run header's settings.
  [[nodiscard]] OrderedJson describe() const;

 private:
  int world_ = 0;
  int gpus_per_node_ = 1;
  int nodes_ = 0;
  int leaves_ = 0;
  int leaf_groups_ = 1;  // rail_optimized: leaves per rail
  int leaf_ports_ = 1;
  double oversubscription_ = 1.0;
  scenarios::Topology topology_ = scenarios::Topology::rail_optimized;
  BytesPerSecond nic_bandwidth_;
  Seconds switch_latency_;
  std::vector<Link> links_;
};

}  // namespace threewalls::sim
