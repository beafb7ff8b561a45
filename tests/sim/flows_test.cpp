// Collectives as flows, aggregation, and max-min sharing (pure, no SimGrid).
#include <gtest/gtest.h>

#include <algorithm>
#include <iterator>
#include <map>
#include <numeric>
#include <set>

#include "sim_test_support.hpp"
#include "threewalls/scenarios/layout.hpp"
#include "threewalls/sim/flows.hpp"

namespace threewalls::sim {
namespace {

std::vector<int> iota(int n, int from = 0) {
  std::vector<int> v(static_cast<std::size_t>(n));
  std::iota(v.begin(), v.end(), from);
  return v;
}

TEST(Flows, RingAllReduceSendsTwoNMinusOneOverNOfTheSizeToTheNextMember) {
  const auto m = iota(8);
  const auto f = collective_flows(Collective::all_reduce, Algorithm::ring, m, 800.0, Split{});
  ASSERT_EQ(f.size(), 8U);
  for (const auto& x : f) {
    EXPECT_EQ(x.dst, (x.src + 1) % 8);
    EXPECT_DOUBLE_EQ(x.bytes, 2.0 * 7.0 / 8.0 * 800.0);
  }
  EXPECT_DOUBLE_EQ(bus_traffic_bytes(Collective::all_reduce, m, 800.0, Split{}), 2.0 * 7.0 / 8.0 * 800.0);
}

TEST(Flows, RingAllGatherAndReduceScatterSendNMinusOneOverN) {
  const auto m = iota(4);
  for (Collective k : {Collective::all_gather, Collective::reduce_scatter}) {
    const auto f = collective_flows(k, Algorithm::ring, m, 400.0, Split{});
    ASSERT_EQ(f.size(), 4U);
    for (const auto& x : f) EXPECT_DOUBLE_EQ(x.bytes, 300.0);
  }
}

TEST(Flows, ChainBroadcastForwardsTheWholeBuffer) {
  const auto f = collective_flows(Collective::broadcast, Algorithm::chain, iota(4), 100.0, Split{});
  ASSERT_EQ(f.size(), 3U);
  for (const auto& x : f) EXPECT_DOUBLE_EQ(x.bytes, 100.0);
}

TEST(Flows, PairwiseAllToAllSendsSizeOverNToEveryOtherMember) {
  const auto m = iota(4);
  const auto f = collective_flows(Collective::all_to_all, Algorithm::pairwise, m, 400.0, Split{});
  ASSERT_EQ(f.size(), 12U);
  for (const auto& x : f) {
    EXPECT_NE(x.src, x.dst);
    EXPECT_DOUBLE_EQ(x.bytes, 100.0);
  }
  EXPECT_DOUBLE_EQ(bus_traffic_bytes(Collective::all_to_all, m, 400.0, Split{}), 300.0);
}

TEST(Flows, DispatchSplitFollowsRoutingSharesAndTheHotRankBoundsTheTime) {
  // Imbalance 2 over 4 EP ranks: rank 0 receives 2/4 of every rank's tokens, the others 2/12 each.
  const scenarios::RoutingModel rm(4, 2.0);
  Split split{SplitKind::by_dest, {rm.share(0), rm.share(1), rm.share(2), rm.share(3)}};
  const auto m = iota(4);
  const auto f = collective_flows(Collective::all_to_all, Algorithm::pairwise, m, 1200.0, split, 1);
  ASSERT_EQ(f.size(), 3U);
  std::map<int, double> to;
  for (const auto& x : f) to[x.dst] = x.bytes;
  EXPECT_DOUBLE_EQ(to[0], 600.0);
  EXPECT_DOUBLE_EQ(to[2], 200.0);
  // Rank 0 receives 3 x 600 bytes: the largest traffic of any member.
  EXPECT_DOUBLE_EQ(bus_traffic_bytes(Collective::all_to_all, m, 1200.0, split), 1800.0);
  // Combine (by source): the hot rank sends its share to everyone.
  Split back{SplitKind::by_src, split.share};
  const auto g = collective_flows(Collective::all_to_all, Algorithm::pairwise, m, 1200.0, back, 0);
  for (const auto& x : g) EXPECT_DOUBLE_EQ(x.bytes, 600.0);
}

TEST(Flows, DoubleBinaryTreeEdgesCarryHalfTheBufferEachWay) {
  const int n = 8;
  const auto f = collective_flows(Collective::all_reduce, Algorithm::tree, iota(n), 100.0, Split{});
  EXPECT_EQ(f.size(), static_cast<std::size_t>(4 * (n - 1)));
  std::map<std::pair<int, int>, double> edge;
  for (const auto& x : f) {
    EXPECT_DOUBLE_EQ(x.bytes, 50.0);
    edge[{x.src, x.dst}] += x.bytes;
  }
  // Every edge is used in both directions.
  for (const auto& [k, v] : edge) EXPECT_TRUE(edge.count({k.second, k.first})) << k.first << "->" << k.second;
}

TEST(Flows, OneSourceGetsItsFlowsOfAllSourcesInTheSameOrder) {
  // Without nodes, and on nodes of 4 GPUs (rails when every node of the group has as many members).
  for (const int gpn : {0, 4}) {
    for (const Algorithm algo : {Algorithm::ring, Algorithm::chain, Algorithm::tree, Algorithm::pairwise}) {
      for (int n = 1; n <= 12; ++n) {
        std::vector<int> m = iota(n, 100);
        std::reverse(m.begin(), m.end());
        std::rotate(m.begin(), m.begin() + n / 3, m.end());
        const auto all = collective_flows(Collective::all_reduce, algo, m, 900.0, Split{}, -1, gpn);
        for (const int src : m) {
          const auto one = collective_flows(Collective::all_reduce, algo, m, 900.0, Split{}, src, gpn);
          std::vector<RankFlow> want;
          std::copy_if(all.begin(), all.end(), std::back_inserter(want),
                       [&](const RankFlow& f) { return f.src == src; });
          ASSERT_EQ(one.size(), want.size()) << to_string(algo) << " gpn " << gpn << " n " << n << " src " << src;
          for (std::size_t k = 0; k < one.size(); ++k) {
            EXPECT_EQ(one[k].dst, want[k].dst) << to_string(algo) << " gpn " << gpn << " n " << n << " src " << src;
            EXPECT_EQ(one[k].bytes, want[k].bytes) << to_string(algo) << " gpn " << gpn << " n " << n;
          }
        }
      }
    }
  }
}

TEST(Flows, RailsAreTheMembersPerNodeWhenEveryNodeHoldsAsMany) {
  EXPECT_EQ(rails_of(iota(16), 8), 8);
  EXPECT_EQ(rails_of(std::vector<int>{0, 1, 8, 9, 16, 17}, 8), 2);
  EXPECT_EQ(rails_of(std::vector<int>{0, 4, 8, 12}, 8), 2);  // strided members, two per node
  EXPECT_EQ(rails_of(std::vector<int>{0, 1, 2, 8}, 8), 1);   // uneven: no channel per rail
  EXPECT_EQ(rails_of(std::vector<int>{0, 8, 9, 1, 2, 10}, 8), 3);
  EXPECT_EQ(rails_of(iota(8), 8), 1);                         // within one node
  EXPECT_EQ(rails_of(std::vector<int>{0, 8, 16, 24}, 8), 1);  // one member per node
  EXPECT_EQ(rails_of(iota(16), 0), 1);
}

TEST(Flows, RingAcrossNodesRunsOneChannelPerRailAndEachNicCarriesItsShare) {
  // 2 nodes x 8 GPUs: every member sends 7/8 of its ring traffic to the next GPU of its node and 1/8
  // through its own NIC to the GPU of the same local position on the other node.
  const auto m = iota(16);
  const double traffic = 2.0 * 15.0 / 16.0 * 1600.0;
  const auto f = collective_flows(Collective::all_reduce, Algorithm::ring, m, 1600.0, Split{}, -1, 8);
  ASSERT_EQ(f.size(), 32U);
  std::map<int, double> nic_out, nv_out;
  for (const auto& x : f) {
    if (x.src / 8 == x.dst / 8) {
      EXPECT_EQ(x.dst, x.src / 8 * 8 + (x.src % 8 + 1) % 8);
      nv_out[x.src] += x.bytes;
    } else {
      EXPECT_EQ(x.dst % 8, x.src % 8);
      nic_out[x.src] += x.bytes;
    }
  }
  for (int r = 0; r < 16; ++r) {
    EXPECT_DOUBLE_EQ(nic_out[r], traffic / 8.0);
    EXPECT_DOUBLE_EQ(nv_out[r], traffic * 7.0 / 8.0);
  }
  // The tree all-reduce and the broadcast chain take the same channels; without the node size, a ring.
  EXPECT_EQ(collective_flows(Collective::all_reduce, Algorithm::tree, m, 1600.0, Split{}, 3, 8).size(), 2U);
  const auto b = collective_flows(Collective::broadcast, Algorithm::chain, m, 1600.0, Split{}, 3, 8);
  ASSERT_EQ(b.size(), 2U);
  EXPECT_DOUBLE_EQ(b[0].bytes + b[1].bytes, 1600.0);
  EXPECT_EQ(collective_flows(Collective::all_reduce, Algorithm::ring, m, 1600.0, Split{}, 3).size(), 1U);
  // Within one node nothing changes.
  const auto one = collective_flows(Collective::all_reduce, Algorithm::ring, iota(8), 800.0, Split{}, -1, 8);
  ASSERT_EQ(one.size(), 8U);
  for (const auto& x : one) EXPECT_EQ(x.dst, (x.src + 1) % 8);
}

TEST(Flows, RailsBusTimeIsTheSlowerOfTheNicShareAndTheNvlinkShare) {
  EXPECT_DOUBLE_EQ(rails_bus_time(800.0, 1, 40.0, 400.0), 20.0);
  EXPECT_DOUBLE_EQ(rails_bus_time(800.0, 8, 40.0, 400.0), 800.0 / 8.0 / 40.0);          // NICs bind
  EXPECT_DOUBLE_EQ(rails_bus_time(800.0, 8, 400.0, 100.0), 800.0 * 7.0 / 8.0 / 100.0);  // NVLink binds
  EXPECT_DOUBLE_EQ(rails_bus_time(0.0, 8, 40.0, 400.0), 0.0);
}

TEST(Flows, OnlySourceFilterKeepsOneMembersFlows) {
  const auto f = collective_flows(Collective::all_to_all, Algorithm::pairwise, iota(8), 800.0, Split{}, 3);
  ASSERT_EQ(f.size(), 7U);
  for (const auto& x : f) EXPECT_EQ(x.src, 3);
}

TEST(Flows, BusFactorsAreNcclTests) {
  EXPECT_DOUBLE_EQ(bus_factor(Collective::all_reduce, 4), 1.5);
  EXPECT_DOUBLE_EQ(bus_factor(Collective::all_gather, 4), 0.75);
  EXPECT_DOUBLE_EQ(bus_factor(Collective::all_to_all, 8), 7.0 / 8.0);
  EXPECT_DOUBLE_EQ(bus_factor(Collective::send_recv, 2), 1.0);
  EXPECT_DOUBLE_EQ(latency_hops(Collective::all_reduce, Algorithm::ring, 8), 14);
  EXPECT_DOUBLE_EQ(latency_hops(Collective::all_reduce, Algorithm::tree, 8), 6);
}

TEST(Flows, AutomaticAllReducePicksTreeOnlyForSmallInterNodeBuffers) {
  EXPECT_EQ(choose_algorithm(Collective::all_reduce, AllReduceChoice::automatic, true, 1e6, 16), Algorithm::tree);
  EXPECT_EQ(choose_algorithm(Collective::all_reduce, AllReduceChoice::automatic, true, 1e9, 16), Algorithm::ring);
  EXPECT_EQ(choose_algorithm(Collective::all_reduce, AllReduceChoice::automatic, false, 1e6, 8), Algorithm::ring);
  EXPECT_EQ(choose_algorithm(Collective::all_reduce, AllReduceChoice::tree, false, 1e9, 8), Algorithm::tree);
  EXPECT_EQ(choose_algorithm(Collective::all_to_all, AllReduceChoice::tree, true, 1e3, 8), Algorithm::pairwise);
}

TEST(Flows, AggregationMergesBySameNodeSameLeafOtherLeafAndKeepsBytes) {
  const Platform p(testing::cluster(8, 4));  // rail optimised, one leaf per rail
  const auto m = iota(32);
  const auto raw = collective_flows(Collective::all_to_all, Algorithm::pairwise, m, 3200.0, Split{}, 0);
  const auto agg = aggregate_flows(raw, m, p);
  ASSERT_EQ(agg.size(), 3U);
  double total = 0.0;
  for (const auto& x : agg) total += x.bytes;
  EXPECT_DOUBLE_EQ(total, 31 * 100.0);
  std::map<int, double> to;
  for (const auto& x : agg) to[x.dst] = x.bytes;
  EXPECT_DOUBLE_EQ(to.at(1), 700.0);   // same node: 7 peers, to the next member
  EXPECT_DOUBLE_EQ(to.at(8), 300.0);   // same rail (leaf), other nodes: 3 peers
  EXPECT_DOUBLE_EQ(to.at(9), 2100.0);  // other rails: 21 peers
}

TEST(Flows, AllToAllAcrossNodesSplitsEachMembersBytesIntoNvlinkAndNetwork) {
  const Platform p(testing::cluster(8, 4));
  const auto m = iota(32);
  const A2aByLink b = a2a_by_link(m, 3200.0, Split{}, p);
  ASSERT_EQ(b.members_per_node, (std::vector<int>{8, 8, 8, 8}));
  for (const auto& x : b.members) {
    EXPECT_DOUBLE_EQ(x.nvlink, 7 * 100.0);    // 7 peers in the node
    EXPECT_DOUBLE_EQ(x.network, 24 * 100.0);  // 24 peers in other nodes
  }
  EXPECT_EQ(b.members[9].node, 1);
}

TEST(Flows, FlexDedupSendsOneCopyPerDestinationNodeAndForwardsOverNvlink) {
  const Platform p(testing::cluster(8, 4));
  const auto m = iota(32);
  const std::vector<double> dedup{0.25, 0.25, 0.25, 0.25};
  const A2aByLink b = a2a_by_link(m, 3200.0, Split{}, p, dedup);
  for (const auto& x : b.members) {
    EXPECT_DOUBLE_EQ(x.network, 0.25 * 2400.0);
    EXPECT_DOUBLE_EQ(x.nvlink, 700.0 + 2400.0);  // own node's bytes + what it forwards / receives for other nodes
  }
  EXPECT_THROW((void)a2a_by_link(m, 3200.0, Split{}, p, std::vector<double>{1.0}), std::logic_error);
}

TEST(Flows, NodeUseProbabilityFollowsDrawsWithoutReplacementAndRouterGroups) {
  // 2 experts of 4 on the node, top-1: half the tokens.
  EXPECT_DOUBLE_EQ(node_use_probability({DispatchKind::flex, 4, 1, 0, 0}, 2), 0.5);
  // top-2 of 4, node holds 2: 1 - C(2,2)/C(4,2) = 5/6.
  EXPECT_NEAR(node_use_probability({DispatchKind::flex, 4, 2, 0, 0}, 2), 5.0 / 6.0, 1e-12);
  // A node holding every expert is always used; none never.
  EXPECT_DOUBLE_EQ(node_use_probability({DispatchKind::flex, 4, 2, 0, 0}, 4), 1.0);
  EXPECT_DOUBLE_EQ(node_use_probability({DispatchKind::flex, 4, 2, 0, 0}, 0), 0.0);
  // DeepSeek-V3 on 8 nodes: 256 experts in 8 groups, 4 groups per token; a node holds one group.
  EXPECT_NEAR(node_use_probability({DispatchKind::flex, 256, 8, 8, 4}, 32), 0.5, 1e-12);
  // A node holding half a group: the group is chosen (4/8), then 1 - C(96, 8)/C(128, 8) of the top-8
  // drawn from the 4 chosen groups' 128 experts land on its 16.
  double none = 1.0;
  for (int t = 0; t < 8; ++t) none *= (112.0 - t) / (128.0 - t);
  EXPECT_NEAR(node_use_probability({DispatchKind::flex, 256, 8, 8, 4}, 16), 0.5 * (1.0 - none), 1e-12);
}

TEST(Flows, DedupFactorIsNodesUsedOverCopiesToOtherNodes) {
  // DeepSeek-V3, EP64 over 8 nodes, 4 of 8 groups: 7 x 0.5 nodes over 8 x 7/8 copies.
  const std::vector<int> experts(8, 32);
  EXPECT_NEAR(dedup_factor({DispatchKind::flex, 256, 8, 8, 4}, experts, 0), 3.5 / 7.0, 1e-12);
  // Qwen3-30B, EP16 over 2 nodes, no groups: the other node is used unless all 8 experts are local.
  double none = 1.0;
  for (int t = 0; t < 8; ++t) none *= (64.0 - t) / (128.0 - t);
  const std::vector<int> two(2, 64);
  EXPECT_NEAR(dedup_factor({DispatchKind::flex, 128, 8, 0, 0}, two, 1), (1.0 - none) / 4.0, 1e-12);
  // One node: nothing leaves it.
  EXPECT_DOUBLE_EQ(dedup_factor({DispatchKind::flex, 128, 8, 0, 0}, std::vector<int>{128}, 0), 1.0);
}

TEST(Flows, RdmaCountFactorIsEveryNodeUsedOverTheOtherNodesUsed) {
  // DeepSeek-V3 on EP64: every node used with probability 0.5, so 4 nodes counted for 3.5 crossing.
  const std::vector<int> experts(8, 32);
  EXPECT_NEAR(rdma_count_factor({DispatchKind::flex, 256, 8, 8, 4}, experts, 3), 4.0 / 3.5, 1e-12);
  // Two nodes without groups: each used unless all 8 experts fall on the other, so about 2.
  double none = 1.0;
  for (int t = 0; t < 8; ++t) none *= (64.0 - t) / (128.0 - t);
  const std::vector<int> two(2, 64);
  EXPECT_NEAR(rdma_count_factor({DispatchKind::flex, 128, 8, 0, 0}, two, 0), 2.0, 1e-12);
  EXPECT_GT(1.0 - none, 0.99);
  // One node: nothing crosses, the factor is 1.
  EXPECT_DOUBLE_EQ(rdma_count_factor({DispatchKind::flex, 128, 8, 0, 0}, std::vector<int>{128}, 0), 1.0);
}

TEST(Flows, AggregatedDestinationsAreDistinctInASymmetricPattern) {
  const Platform p(testing::cluster(8, 2));
  const auto m = iota(16);
  const auto raw = collective_flows(Collective::all_to_all, Algorithm::pairwise, m, 1600.0, Split{});
  const auto agg = aggregate_flows(raw, m, p);
  std::map<int, int> received;
  for (const auto& x : agg) {
    if (p.node_of(x.src) == p.node_of(x.dst)) ++received[x.dst];
  }
  for (const auto& [dst, count] : received) EXPECT_EQ(count, 1) << "rank " << dst;
}

PlacedFlow flow(std::vector<std::uint32_t> links, double bytes) { return {{}, {}, bytes, std::move(links)}; }

TEST(Flows, TwoFlowsOnOneLinkShareIt) {
  const std::vector<double> cap{100.0, 1000.0, 1000.0};
  const std::vector<PlacedFlow> f{flow({0, 1}, 1.0), flow({0, 2}, 1.0)};
  const auto r = max_min_rates(f, cap);
  EXPECT_DOUBLE_EQ(r[0], 50.0);
  EXPECT_DOUBLE_EQ(r[1], 50.0);
  // Alone, one flow takes the whole link.
  EXPECT_DOUBLE_EQ(max_min_rates(std::vector<PlacedFlow>{flow({0, 1}, 1.0)}, cap)[0], 100.0);
}

TEST(Flows, MaxMinGivesTheBottleneckedFlowItsShareAndTheRestToOthers) {
  // Link 0 (cap 10) carries flows A and B; link 1 (cap 4) carries B and C.
  const std::vector<double> cap{10.0, 4.0};
  const std::vector<PlacedFlow> f{flow({0}, 1.0), flow({0, 1}, 1.0), flow({1}, 1.0)};
  const auto r = max_min_rates(f, cap);
  EXPECT_DOUBLE_EQ(r[1], 2.0);
  EXPECT_DOUBLE_EQ(r[2], 2.0);
  EXPECT_DOUBLE_EQ(r[0], 8.0);
}

TEST(Flows, LoneMakespanReSolvesWhenAFlowFinishes) {
  // 100 and 300 bytes on one link of 100 B/s: 400 bytes in all, 4 s.
  const std::vector<double> cap{100.0};
  const std::vector<PlacedFlow> f{flow({0}, 100.0), flow({0}, 300.0)};
  EXPECT_NEAR(lone_makespan(f, cap), 4.0, 1e-12);
  // Scaling every flow by k scales the makespan by k.
  const std::vector<PlacedFlow> g{flow({0}, 250.0), flow({0}, 750.0)};
  EXPECT_NEAR(lone_makespan(g, cap), 10.0, 1e-12);
}

}  // namespace
}  // namespace threewalls::sim
