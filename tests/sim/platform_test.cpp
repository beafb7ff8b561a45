// The pure platform description (no SimGrid): links, routes, leaves, latencies, slowdowns.
#include <gtest/gtest.h>

#include <stdexcept>

#include "sim_test_support.hpp"
#include "threewalls/core/error.hpp"
#include "threewalls/sim/platform.hpp"

namespace threewalls::sim {
namespace {

using testing::cluster;

std::vector<std::string> names(const Platform& p, Endpoint a, Endpoint b) {
  std::vector<std::uint32_t> ids;
  p.route(a, b, ids);
  std::vector<std::string> out;
  for (auto id : ids) out.push_back(p.link_name(id));
  return out;
}

TEST(Platform, IntraNodeRouteCrossesBothNvlinkPorts) {
  const Platform p(cluster(8, 2));
  const auto [a, b] = p.gpu_endpoints(1, 5);
  EXPECT_EQ(a.kind, PortKind::gpu);
  EXPECT_EQ(names(p, a, b), (std::vector<std::string>{"nvlink_up.1", "nvlink_down.5"}));
}

TEST(Platform, SameLeafRouteCrossesOnlyTheNics) {
  const Platform p(cluster(8, 4));  // rail optimised: GPU 2 of every node on leaf "rail 2"
  const auto [a, b] = p.gpu_endpoints(2, 8 * 3 + 2);
  EXPECT_EQ(a.kind, PortKind::nic);
  EXPECT_EQ(names(p, a, b), (std::vector<std::string>{"nic_up.2", "nic_down.26"}));
}

TEST(Platform, CrossLeafRouteCrossesSpinePorts) {
  const Platform p(cluster(8, 4));
  const auto [a, b] = p.gpu_endpoints(2, 8 + 3);  // rail 2 -> rail 3
  EXPECT_EQ(a.kind, PortKind::nic_spine);
  EXPECT_EQ(names(p, a, b), (std::vector<std::string>{"nic_up.2", "spine_up.2", "spine_down.11", "nic_down.11"}));
}

TEST(Platform, RailOptimizedLeafJoinsOneRailOfConsecutiveNodes) {
  auto c = cluster(8, 6);
  c.leaf_switch_ports = 4;  // 4 nodes per leaf and rail
  const Platform p(c);
  EXPECT_EQ(p.leaves(), 8 * 2);
  EXPECT_EQ(p.leaf_of(0), p.leaf_of(8 * 3));       // rail 0, nodes 0 and 3
  EXPECT_NE(p.leaf_of(0), p.leaf_of(8 * 4));       // rail 0, node 4: next group
  EXPECT_NE(p.leaf_of(0), p.leaf_of(1));           // rail 0 vs rail 1
}

TEST(Platform, FatTreeLeafJoinsConsecutiveRanks) {
  auto c = cluster(8, 4);
  c.topology = scenarios::Topology::fat_tree;
  c.leaf_switch_ports = 16;
  const Platform p(c);
  EXPECT_EQ(p.leaves(), 2);
  EXPECT_EQ(p.leaf_of(0), p.leaf_of(15));
  EXPECT_NE(p.leaf_of(15), p.leaf_of(16));
}

TEST(Platform, SpinePortIsTheNicShareUnderOversubscription) {
  auto c = cluster(8, 4);
  c.oversubscription = 4.0;
  const Platform p(c);
  EXPECT_DOUBLE_EQ(p.links()[p.link_id(LinkKind::spine_up, 3)].bandwidth.value, 50e9 / 4.0);
  EXPECT_DOUBLE_EQ(p.route_bandwidth({PortKind::nic_spine, 2}, {PortKind::nic_spine, 11}).value, 50e9 / 4.0);
  EXPECT_DOUBLE_EQ(p.route_bandwidth({PortKind::nic, 2}, {PortKind::nic, 10}).value, 50e9);
}

TEST(Platform, SlowLinkDividesBothDirections) {
  Platform p(cluster(8, 2));
  p.slow_link(3, scenarios::SlowLink::nvlink, 4.0);
  EXPECT_DOUBLE_EQ(p.links()[p.link_id(LinkKind::nvlink_up, 3)].bandwidth.value, 450e9 / 4);
  EXPECT_DOUBLE_EQ(p.links()[p.link_id(LinkKind::nvlink_down, 3)].bandwidth.value, 450e9 / 4);
  EXPECT_DOUBLE_EQ(p.links()[p.link_id(LinkKind::nvlink_up, 2)].bandwidth.value, 450e9);
}

TEST(Platform, RouteLatencyAddsLinkLatenciesAndSwitches) {
  auto c = cluster(8, 4);
  c.nvlink_latency = microseconds(1);
  c.nic_latency = microseconds(2);
  c.switch_latency = microseconds(0.5);
  const Platform p(c);
  EXPECT_NEAR(p.route_latency({PortKind::gpu, 0}, {PortKind::gpu, 1}).value, 1e-6, 1e-15);
  EXPECT_NEAR(p.route_latency({PortKind::nic, 0}, {PortKind::nic, 8}).value, 2e-6 + 2e-6 + 0.5e-6, 1e-15);
  EXPECT_NEAR(p.route_latency({PortKind::nic_spine, 0}, {PortKind::nic_spine, 9}).value, 4e-6 + 1.5e-6, 1e-15);
}

TEST(Platform, PcieCopiesUseTheGpusOwnLink) {
  const Platform p(cluster(8, 2));
  EXPECT_EQ(names(p, {PortKind::host, 1}, {PortKind::gpu_pcie, 9}), (std::vector<std::string>{"pcie_down.9"}));
  EXPECT_EQ(names(p, {PortKind::gpu_pcie, 9}, {PortKind::host, 1}), (std::vector<std::string>{"pcie_up.9"}));
}

TEST(Platform, PairsWithoutRouteAreLogicErrors) {
  const Platform p(cluster(8, 2));
  std::vector<std::uint32_t> ids;
  EXPECT_THROW(p.route({PortKind::gpu, 0}, {PortKind::gpu, 8}, ids), std::logic_error);
  EXPECT_THROW(p.route({PortKind::host, 0}, {PortKind::gpu_pcie, 8}, ids), std::logic_error);
  EXPECT_THROW(p.route({PortKind::nic, 0}, {PortKind::gpu, 1}, ids), std::logic_error);
}

TEST(Platform, ClusterWithoutGpusIsInputError) {
  auto c = cluster(8, 0);
  EXPECT_THROW(Platform{c}, InputError);
  auto d = cluster(8, 1);
  d.nic_bandwidth = BytesPerSecond(0.0);
  EXPECT_THROW(Platform{d}, InputError);
}

}  // namespace
}  // namespace threewalls::sim
