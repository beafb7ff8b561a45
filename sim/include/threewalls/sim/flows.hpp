#pragma once
// Collectives as the flows NCCL sends, and the max-min sharing of flows on the platform. Pure code
// (no SimGrid): the SimGrid adapter only runs what this plans. Equations: docs/simulator.md
// ("Collectives as flows").
//
// Traffic of one collective of nccl-tests size S over n members (every member sends, in parallel):
//   ring all_reduce         member i -> i+1:  2(n-1)/n S
//   ring all_gather,
//   ring reduce_scatter     member i -> i+1:  (n-1)/n S
//   chain broadcast         member i -> i+1 for i < n-1:  S   (pipelined from the root, member 0)
//   double binary tree      both trees carry S/2; each tree edge carries S/2 up (reduce) and S/2
//     all_reduce            down (broadcast). Tree 1 is the binary heap over member order, tree 2
//                           the same over the order shifted by one.
//   pairwise all_to_all     member i -> j != i:  S w_ij  (w from the split, below)
//   send/recv               sender -> receiver:  S
// Bus-bandwidth time (nccl-tests): T_bw = f(n) S / busbw, f = 2(n-1)/n, (n-1)/n, 1 as above; for
// an uneven all_to_all f S is replaced by the largest traffic any member sends or receives.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "threewalls/core/units.hpp"
#include "threewalls/core/vocabulary.hpp"
#include "threewalls/sim/platform.hpp"

namespace threewalls::sim {

using threewalls::to_string;
enum class Algorithm : std::uint8_t { ring, tree, chain, pairwise, p2p };
// The user's choice for all-reduce; auto = NCCL's rule of thumb (docs/simulator.md).
enum class AllReduceChoice : std::uint8_t { automatic, ring, tree };
const char* to_string(Algorithm a);
const char* to_string(AllReduceChoice a);

// nccl-tests bus-bandwidth factor f(n).
double bus_factor(Collective kind, int n);

// Which algorithm carries a collective. all_reduce: `choice`; automatic picks tree when the group
// spans nodes and the buffer is at most kTreeMaxBytes per member, ring otherwise (NCCL prefers
// trees for small and medium inter-node all-reduces). all_gather, reduce_scatter: ring; broadcast:
// chain; all_to_all: pairwise; send_recv: p2p.
inline constexpr double kTreeMaxBytesPerMember = 4.0 * 1024 * 1024;
Algorithm choose_algorithm(Collective kind, AllReduceChoice choice, bool spans_nodes, double bytes, int n);

// Sequential latency steps of an algorithm over n members (ring all_reduce 2(n-1), ring all_gather /
// reduce_scatter n-1, chain n-1, tree 2 ceil(log2 n), pairwise 1, p2p 1).
int latency_hops(Collective kind, Algorithm algo, int n);

// How an all_to_all's S splits over peers (StepGraph shape[1], step_graph.hpp):
//   uniform  every member sends S / n to every member;
//   by_dest  member i sends S share(j) to member j   (MoE dispatch);
//   by_src   member i sends S share(i) to every member (MoE combine), so its total is n S share(i).
enum class SplitKind : std::uint8_t { uniform, by_dest, by_src };
struct Split {
  SplitKind kind = SplitKind::uniform;
  std::vector<double> share;  // per member position; empty for uniform; sums to 1
};

// How a token reaches its top-k experts' GPUs when the expert-parallel group spans nodes
// (docs/simulator.md, "Expert dispatch across nodes"). Megatron's --moe-token-dispatcher-type:
//   alltoall  NCCL all-to-all: every copy of a token goes straight to its expert's GPU, bytes to peers
//             in the node over NVLink and bytes to peers in other nodes over the network, both at once;
//   flex      DeepEP-style (--moe-enable-deepep / --moe-flex-dispatcher-backend): a token crosses the
//             network once per destination node (to the GPU of the same local index there) and is
//             forwarded over NVLink to its experts' GPUs in that node.
// Routing is node-limited when the router picks groups first (--moe-router-num-groups G,
// --moe-router-group-topk g): a token's experts lie in g of G contiguous expert groups.
enum class DispatchKind : std::uint8_t { alltoall, flex };
struct ExpertDispatch {
  DispatchKind kind = DispatchKind::alltoall;
  int num_experts = 0;  // routed experts, spread evenly over the EP group in member order
  int topk = 0;
  int num_groups = 0;  // 0 or 1: no group-limited routing
  int group_topk = 0;
};

// Probability that a token's experts include at least one of `node_experts` experts held by one node
// (a contiguous run of the expert order), for balanced routing over `d.num_experts` experts: top-k
// drawn without replacement; with router groups, a node holding whole groups is used when one of its
// groups is chosen, a node holding part of one group when that group is chosen and one of the top-k
// (drawn from the chosen groups' experts) lands on it. Other group shapes are treated as ungrouped.
double node_use_probability(const ExpertDispatch& d, int node_experts);

// For a flex dispatch from a member of node `own`: bytes the network carries over the bytes a
// pairwise all-to-all sends to other nodes, E[distinct other nodes a token uses] / E[copies of a token
// to other nodes], in (0, 1]; 1 when no copy leaves the node. `experts_per_node[m]` is the experts of
// node m (members of the node x experts per member).
double dedup_factor(const ExpertDispatch& d, std::span<const int> experts_per_node, std::size_t own);

// DeepEP's count of a dispatch's RDMA bytes over the network bytes of a member of node `own`: its
// benchmark counts a token once per node it uses, its own node included (rdma_idx.ne(-1).sum() in
// DeepEP's tests), while the network carries the other nodes' copies only:
//   (sum over all nodes m of P(m used)) / (sum over m != own of P(m used)),  >= 1; 1 when no copy
// leaves the node. Dividing the published bandwidth by it gives the bandwidth of the network bytes.
double rdma_count_factor(const ExpertDispatch& d, std::span<const int> experts_per_node, std::size_t own);

// An all-to-all over a group that spans nodes, by the links its bytes cross. Per member position:
// its node's index among the group's nodes, the bytes it sends or receives (the larger) over NVLink
// and over the network. alltoall: bytes to and from peers of the same node over NVLink, the others
// over the network. flex (`dedup` non-empty: the factor of each node index, dedup_factor): the network
// carries a sender's bytes to other nodes times its node's factor, and NVLink carries, beside the bytes
// within the node, the bytes the member forwards to and receives from its node's GPUs for peers of
// other nodes (the bytes destined to it from other nodes before de-duplication; balanced routing
// spreads the forwarding evenly over a node's GPUs).
struct A2aLinkBytes {
  int node = 0;
  double nvlink = 0.0;
  double network = 0.0;
};
struct A2aByLink {
  std::vector<A2aLinkBytes> members;
  std::vector<int> members_per_node;  // by node index
};
// The members of `members` on each node they touch, nodes indexed in order of first appearance (as
// A2aByLink::members_per_node and A2aLinkBytes::node); with `node_of_member`, each member's node index.
std::vector<int> members_per_node(std::span<const int> members, const Platform& platform,
                                  std::vector<int>* node_of_member = nullptr);
A2aByLink a2a_by_link(std::span<const int> members, double size, const Split& split, const Platform& platform,
                      std::span<const double> dedup = {});

// A GPU-to-GPU flow of nccl traffic (bytes as sent, before any efficiency scaling).
struct RankFlow {
  int src = 0;
  int dst = 0;
  double bytes = 0.0;
};

// Rails of a group that spans nodes (docs/simulator.md, "Rings across nodes"): the number of members
// it has on each node it touches, when that number is the same on every such node; 1 otherwise, and
// for a group within one node. NCCL builds a ring, chain or tree across nodes as one channel per
// local GPU, each channel leaving a node through its own GPU's NIC (rail-optimised nodes with one NIC
// per GPU), so such a collective moves its inter-node bytes over `rails` NICs of every node at once.
int rails_of(std::span<const int> members, int gpus_per_node);

// Bus-bandwidth time of a ring, chain or tree collective with `traffic` bytes per member (f(n) S)
// over a group that spans nodes with `rails` members on each: a member's NIC carries traffic / rails
// (it is the exit of one channel in `rails`), its NVLink port the other (rails - 1) / rails, both at
// once; network_busbw is the profile's per-NIC network curve, nvlink_busbw its NVLink curve at
// `rails` members. rails = 1: traffic / network_busbw.
double rails_bus_time(double traffic, int rails, double network_busbw, double nvlink_busbw);

// The flows of one collective over `members` (ranks in group order) whose source is `only_src` (all
// sources when only_src < 0). `size` is the nccl-tests size S of the members' op (for by_src, the
// balanced size). Self flows and zero-byte flows are left out. With `gpus_per_node` > 0, a ring, chain
// or tree over a group with rails_of(...) = L > 1 is placed as its channels run: each member sends
// (L - 1) / L of its ring traffic (2(n-1)/n S for an all_reduce, ring or tree; (n-1)/n S for
// all_gather and reduce_scatter; S for a broadcast) to the next member of its node in group order
// over NVLink, and 1 / L to the member of the same local position on the next node of the group.
std::vector<RankFlow> collective_flows(Collective kind, Algorithm algo, std::span<const int> members, double size,
                                       const Split& split, int only_src = -1, int gpus_per_node = 0);

// f(n) S, or for an all_to_all the largest bytes any member sends or receives (self excluded).
double bus_traffic_bytes(Collective kind, std::span<const int> members, double size, const Split& split);

// Merges flows of one source by where they go: same node, another node under the same leaf, another
// node under another leaf. Each merged flow goes to the first destination of its class after the
// source in `members` order, so that in a symmetric pattern every destination receives one merged
// flow per class (docs/simulator.md, "Aggregation").
std::vector<RankFlow> aggregate_flows(std::span<const RankFlow> flows, std::span<const int> members,
                                      const Platform& platform);

// A flow placed on the platform: end points, its route, the bytes it carries.
struct PlacedFlow {
  Endpoint src;
  Endpoint dst;
  double bytes = 0.0;
  std::vector<std::uint32_t> links;
};

// Max-min fair rates (progressive filling) of `flows` alone on links of `capacity` (bytes/s),
// indexed by link id. A flow with no links gets +infinity.
std::vector<double> max_min_rates(std::span<const PlacedFlow> flows, std::span<const double> capacity);

// Time until the last of `flows` finishes when they run alone from time 0 (fluid max-min sharing,
// rates re-solved whenever a flow finishes). Scaling every flow's bytes by k scales it by k.
double lone_makespan(std::span<const PlacedFlow> flows, std::span<const double> capacity);

}  // namespace threewalls::sim
