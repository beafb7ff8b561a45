#include "threewalls/sim/platform.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "threewalls/core/error.hpp"

namespace threewalls::sim {

const char* to_string(LinkKind k) {
  switch (k) {
    case LinkKind::nvlink_up: return "nvlink_up";
    case LinkKind::nvlink_down: return "nvlink_down";
    case LinkKind::pcie_up: return "pcie_up";
    case LinkKind::pcie_down: return "pcie_down";
    case LinkKind::nic_up: return "nic_up";
    case LinkKind::nic_down: return "nic_down";
    case LinkKind::spine_up: return "spine_up";
    case LinkKind::spine_down: return "spine_down";
  }
  return "?";
}

Platform::Platform(const scenarios::ClusterSpec& c) {
  if (c.gpus_per_node < 1 || c.nodes < 1) {
    throw InputError("[cluster] the platform needs at least one node of at least one GPU (gpus_per_node = " +
                     std::to_string(c.gpus_per_node) + ", nodes = " + std::to_string(c.nodes) + ")");
  }
  auto positive = [](BytesPerSecond bw, const char* key) {
    if (!(bw.value > 0.0) || !std::isfinite(bw.value)) {
      throw InputError(std::string("[cluster] ") + key + " must be a positive bandwidth");
    }
  };
  positive(c.nvlink_bandwidth, "nvlink_bandwidth");
  positive(c.pcie_bandwidth, "pcie_bandwidth");
  positive(c.nic_bandwidth, "nic_bandwidth");
  if (c.leaf_switch_ports < 1) throw InputError("[cluster] leaf_switch_ports must be at least 1");
  if (!(c.oversubscription >= 1.0)) throw InputError("[cluster] oversubscription must be at least 1");

  gpus_per_node_ = c.gpus_per_node;
  nodes_ = c.nodes;
  world_ = c.gpus_per_node * c.nodes;
  topology_ = c.topology;
  leaf_ports_ = c.leaf_switch_ports;
  oversubscription_ = c.oversubscription;
  nic_bandwidth_ = c.nic_bandwidth;
  switch_latency_ = c.switch_latency;
  if (topology_ == scenarios::Topology::rail_optimized) {
    leaf_groups_ = (nodes_ + leaf_ports_ - 1) / leaf_ports_;
    leaves_ = leaf_groups_ * gpus_per_node_;
  } else {
    leaves_ = (world_ + leaf_ports_ - 1) / leaf_ports_;
  }

  links_.resize(static_cast<std::size_t>(kLinkKinds) * static_cast<std::size_t>(world_));
  const BytesPerSecond spine(c.nic_bandwidth.value / c.oversubscription);
  for (int r = 0; r < world_; ++r) {
    auto set = [&](LinkKind k, BytesPerSecond bw, Seconds lat) {
      links_[link_id(k, r)] = Link{k, r, bw, lat};
    };
    // One hop GPU -> NVSwitch -> GPU costs nvlink_latency, carried by the up direction.
    set(LinkKind::nvlink_up, c.nvlink_bandwidth, c.nvlink_latency);
    set(LinkKind::nvlink_down, c.nvlink_bandwidth, Seconds(0.0));
    set(LinkKind::pcie_up, c.pcie_bandwidth, c.pcie_latency);
    set(LinkKind::pcie_down, c.pcie_bandwidth, c.pcie_latency);
    set(LinkKind::nic_up, c.nic_bandwidth, c.nic_latency);
    set(LinkKind::nic_down, c.nic_bandwidth, c.nic_latency);
    set(LinkKind::spine_up, spine, Seconds(0.0));
    set(LinkKind::spine_down, spine, Seconds(0.0));
  }
}

int Platform::leaf_of(int rank) const {
  if (topology_ == scenarios::Topology::rail_optimized) {
    const int node = rank / gpus_per_node_;
    const int local = rank % gpus_per_node_;
    return local * leaf_groups_ + node / leaf_ports_;
  }
  return rank / leaf_ports_;
}

std::uint32_t Platform::link_id(LinkKind kind, int index) const {
  return static_cast<std::uint32_t>(kind) * static_cast<std::uint32_t>(world_) + static_cast<std::uint32_t>(index);
}

std::string Platform::link_name(std::uint32_t id) const {
  const Link& l = links_.at(id);
  return std::string(to_string(l.kind)) + "." + std::to_string(l.index);
}

std::pair<Endpoint, Endpoint> Platform::gpu_endpoints(int src_rank, int dst_rank) const {
  if (node_of(src_rank) == node_of(dst_rank)) return {{PortKind::gpu, src_rank}, {PortKind::gpu, dst_rank}};
  if (leaf_of(src_rank) == leaf_of(dst_rank)) return {{PortKind::nic, src_rank}, {PortKind::nic, dst_rank}};
  return {{PortKind::nic_spine, src_rank}, {PortKind::nic_spine, dst_rank}};
}

void Platform::route(Endpoint src, Endpoint dst, std::vector<std::uint32_t>& out) const {
  auto check_rank = [&](int r) {
    if (r < 0 || r >= world_) throw std::logic_error("platform route: rank " + std::to_string(r) + " out of range");
  };
  if (src == dst) return;
  if (src.kind == PortKind::gpu && dst.kind == PortKind::gpu) {
    check_rank(src.index);
    check_rank(dst.index);
    if (node_of(src.index) != node_of(dst.index)) {
      throw std::logic_error("platform route: NVLink ports of different nodes");
    }
    out.push_back(link_id(LinkKind::nvlink_up, src.index));
    out.push_back(link_id(LinkKind::nvlink_down, dst.index));
    return;
  }
  if (src.kind == PortKind::nic && dst.kind == PortKind::nic) {
    check_rank(src.index);
    check_rank(dst.index);
    if (leaf_of(src.index) != leaf_of(dst.index)) throw std::logic_error("platform route: NIC ports of different leaves");
    out.push_back(link_id(LinkKind::nic_up, src.index));
    out.push_back(link_id(LinkKind::nic_down, dst.index));
    return;
  }
  if (src.kind == PortKind::nic_spine && dst.kind == PortKind::nic_spine) {
    check_rank(src.index);
    check_rank(dst.index);
    out.push_back(link_id(LinkKind::nic_up, src.index));
    out.push_back(link_id(LinkKind::spine_up, src.index));
    out.push_back(link_id(LinkKind::spine_down, dst.index));
    out.push_back(link_id(LinkKind::nic_down, dst.index));
    return;
  }
  if (src.kind == PortKind::host && dst.kind == PortKind::gpu_pcie) {
    check_rank(dst.index);
    if (node_of(dst.index) != src.index) throw std::logic_error("platform route: host of another node");
    out.push_back(link_id(LinkKind::pcie_down, dst.index));
    return;
  }
  if (src.kind == PortKind::gpu_pcie && dst.kind == PortKind::host) {
    check_rank(src.index);
    if (node_of(src.index) != dst.index) throw std::logic_error("platform route: host of another node");
    out.push_back(link_id(LinkKind::pcie_up, src.index));
    return;
  }
  throw std::logic_error("platform route: no route between these port kinds");
}

Seconds Platform::route_latency(Endpoint src, Endpoint dst) const {
  std::vector<std::uint32_t> links;
  route(src, dst, links);
  double lat = 0.0;
  for (std::uint32_t id : links) lat += links_[id].latency.value;
  int switches = 0;
  if (src.kind == PortKind::nic && !links.empty()) switches = 1;        // the leaf
  if (src.kind == PortKind::nic_spine && !links.empty()) switches = 3;  // leaf, spine, leaf
  return Seconds(lat + switches * switch_latency_.value);
}

BytesPerSecond Platform::route_bandwidth(Endpoint src, Endpoint dst) const {
  std::vector<std::uint32_t> links;
  route(src, dst, links);
  double bw = std::numeric_limits<double>::infinity();
  for (std::uint32_t id : links) bw = std::min(bw, links_[id].bandwidth.value);
  return BytesPerSecond(bw);
}

void Platform::slow_link(int rank, scenarios::SlowLink which, double factor) {
  if (rank < 0 || rank >= world_) throw InputError("[cluster.slowdown] rank " + std::to_string(rank) + " is outside the world");
  if (!(factor >= 1.0)) throw InputError("[cluster.slowdown] factor must be at least 1");
  auto slow = [&](LinkKind k) {
    Link& l = links_[link_id(k, rank)];
    l.bandwidth = BytesPerSecond(l.bandwidth.value / factor);
  };
  switch (which) {
    case scenarios::SlowLink::nvlink: slow(LinkKind::nvlink_up); slow(LinkKind::nvlink_down); break;
    case scenarios::SlowLink::pcie: slow(LinkKind::pcie_up); slow(LinkKind::pcie_down); break;
    case scenarios::SlowLink::nic:
      slow(LinkKind::nic_up);
      slow(LinkKind::nic_down);
      slow(LinkKind::spine_up);
      slow(LinkKind::spine_down);
      break;
    case scenarios::SlowLink::none: break;
  }
}

OrderedJson Platform::describe() const {
  OrderedJson j;
  j["topology"] = topology_ == scenarios::Topology::rail_optimized ? "rail_optimized_two_level_fat_tree"
                                                                    : "two_level_fat_tree";
  j["nodes"] = nodes_;
  j["gpus_per_node"] = gpus_per_node_;
  j["leaves"] = leaves_;
  j["leaf_switch_ports"] = leaf_ports_;
  j["oversubscription"] = oversubscription_;
  const Link& nv = links_[link_id(LinkKind::nvlink_up, 0)];
  const Link& pc = links_[link_id(LinkKind::pcie_up, 0)];
  const Link& ni = links_[link_id(LinkKind::nic_up, 0)];
  j["nvlink_bandwidth_bytes_per_s"] = nv.bandwidth.value;
  j["nvlink_latency_s"] = nv.latency.value;
  j["pcie_bandwidth_bytes_per_s"] = pc.bandwidth.value;
  j["pcie_latency_s"] = pc.latency.value;
  j["nic_bandwidth_bytes_per_s"] = ni.bandwidth.value;
  j["nic_latency_s"] = ni.latency.value;
  j["switch_latency_s"] = switch_latency_.value;
  j["spine_port_bandwidth_bytes_per_s"] = links_[link_id(LinkKind::spine_up, 0)].bandwidth.value;
  return j;
}

}  // namespace threewalls::sim
