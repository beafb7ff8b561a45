#include <gtest/gtest.h>

#include <set>
#include <stdexcept>

#include "threewalls/scenarios/layout.hpp"
#include "threewalls/scenarios/step_graph.hpp"

using namespace threewalls::scenarios;

// Megatron-Core's default order: tp fastest, then cp, dp, pp; experts etp, ep, edp, pp.
TEST(Layout, DenseGroupsFollowTpCpDpPpOrder) {
  Layout l(2, 1, 4, 2, 1, 4, 2, 8);  // tp2 dp4 pp2 = 16 ranks; ep4 edp2
  EXPECT_EQ(l.world(), 16);
  EXPECT_EQ(l.group_members(Group::tp, 5), (std::vector<int>{4, 5}));
  EXPECT_EQ(l.group_members(Group::dp, 5), (std::vector<int>{1, 3, 5, 7}));
  EXPECT_EQ(l.group_members(Group::pp, 5), (std::vector<int>{5, 13}));
  EXPECT_EQ(l.stage_of(13), 1);
  EXPECT_EQ(l.rank_at_stage(5, 1), 13);
}

TEST(Layout, ExpertGroupsFollowEtpEpEdpPpOrder) {
  Layout l(2, 1, 4, 2, 1, 4, 2, 8);
  EXPECT_EQ(l.group_members(Group::ep, 5), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(l.group_members(Group::edp, 5), (std::vector<int>{1, 5}));
  EXPECT_EQ(l.group_index(Group::ep, 6), 2);
  EXPECT_TRUE(l.group_within_node(Group::ep, 5));
  EXPECT_FALSE(l.group_within_node(Group::pp, 5));
}

// The peer of a send/recv is the group member at (own index + peer) modulo the group size: the next or
// previous pipeline stage with the same dense coordinates, the CP ring neighbour, wrapping at both ends.
TEST(Layout, PeerOfWrapsInsideTheOpsGroup) {
  Layout l(2, 2, 1, 4, 1, 1, 4, 8);  // tp2 cp2 pp4 = 16 ranks
  Op op;
  op.kind = OpKind::send;
  op.group = Group::pp;
  op.peer = 1;
  EXPECT_EQ(l.peer_of(op, 5), l.rank_at_stage(5, 2));
  EXPECT_EQ(l.peer_of(op, l.rank_at_stage(5, 3)), l.rank_at_stage(5, 0));  // last stage wraps to the first
  op.peer = -1;
  EXPECT_EQ(l.peer_of(op, 1), l.rank_at_stage(1, 3));  // first stage wraps to the last
  op.group = Group::cp;
  EXPECT_EQ(l.group_members(Group::cp, 1), (std::vector<int>{1, 3}));
  EXPECT_EQ(l.peer_of(op, 1), 3);
  op.peer = 1;
  EXPECT_EQ(l.peer_of(op, 3), 1);
  op.group = Group::tp;  // any group: the same index rule
  EXPECT_EQ(l.peer_of(op, 4), 5);
  EXPECT_EQ(l.peer_of(op, 5), 4);
}

TEST(Layout, RoutingModelSharesSumToOne) {
  RoutingModel balanced(4, 1.0);
  RoutingModel hot(4, 2.5);
  double sum = 0;
  for (int i = 0; i < 4; ++i) sum += hot.share(i);
  EXPECT_DOUBLE_EQ(sum, 1.0);
  EXPECT_DOUBLE_EQ(hot.load(0), 2.5);
  EXPECT_DOUBLE_EQ(balanced.load(3), 1.0);
}

// A slow rank alone in its class: its tensor-parallel partner and its data-parallel peers see it in
// their groups and the other ranks do not, so they become classes of their own; then every class's
// members see the same classes in each group and the refinement stops.
TEST(Layout, RefiningRankClassesSplitsTheGroupsOfASlowRank) {
  const Layout l(2, 1, 4, 1, 1, 1, 8, 8);  // tp2 dp4: tp groups {0,1} {2,3} {4,5} {6,7}, dp {0,2,4,6} {1,3,5,7}
  std::vector<int> color(8, 0);
  color[5] = 1;
  EXPECT_EQ(refine_rank_classes(l, color), (std::vector<int>{0, 1, 0, 1, 2, 3, 0, 1}));
}

TEST(Layout, RefiningKeepsAPartitionWhoseClassesLookAlike) {
  const Layout l(2, 1, 2, 2, 1, 2, 2, 8);  // tp2 dp2 pp2, ep2 edp2
  std::vector<int> stage(8);
  for (int r = 0; r < 8; ++r) stage[static_cast<std::size_t>(r)] = l.stage_of(r);
  EXPECT_EQ(refine_rank_classes(l, stage), stage);
  // Ids are renumbered by first rank.
  std::vector<int> reversed(8);
  for (int r = 0; r < 8; ++r) reversed[static_cast<std::size_t>(r)] = 7 - l.stage_of(r);
  EXPECT_EQ(refine_rank_classes(l, reversed), stage);
  EXPECT_THROW((void)refine_rank_classes(l, std::vector<int>(3, 0)), std::invalid_argument);
}

// With dp2 pp4 and one slow rank at stage 1, the ranks of its pipeline split from their stage peers:
// every rank ends in a class of its own.
TEST(Layout, RefiningFollowsThePipeline) {
  const Layout l(1, 1, 2, 4, 1, 1, 2, 8);  // dp2 pp4: pp groups {0,2,4,6} {1,3,5,7}
  std::vector<int> color(8);
  for (int r = 0; r < 8; ++r) color[static_cast<std::size_t>(r)] = l.stage_of(r);
  color[3] = 9;
  const std::vector<int> refined = refine_rank_classes(l, color);
  std::set<int> distinct(refined.begin(), refined.end());
  EXPECT_EQ(distinct.size(), 8U);
}
