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

// The NCCL operation a flow set carries: the core vocabulary's Collective.
using CommKind = threewalls::Collective;
using threewalls::to_string;
enum class Algorithm : std::uint8_t { ring, tree, chain, pairwise, p2p };
// The user's choice for all-reduce; auto = NCCL's rule of thumb (docs/simulator.md).
enum class AllReduceChoice : std::uint8_t { automatic, ring, tree };
const char* to_string(Algorithm a);
const char* to_string(AllReduceChoice a);

// nccl-tests bus-bandwidth factor f(n).
double bus_factor(CommKind kind, int n);

// Which algorithm carries a collective. all_reduce: `choice`; automatic picks tree when the group
// spans nodes and the buffer is at most kTreeMaxBytes per member, ring otherwise (NCCL prefers
// trees for small and medium inter-node all-reduces). all_gather, reduce_scatter: ring; broadcast:
// chain; all_to_all: pairwise; send_recv: p2p.
inline constexpr double kTreeMaxBytesPerMember = 4.0 * 1024 * 1024;
Algorithm choose_algorithm(CommKind kind, AllReduceChoice choice, bool spans_nodes, double bytes, int n);

// Sequential latency steps of an algorithm over n members (ring all_reduce 2(n-1), ring all_gather /
// reduce_scatter n-1, chain n-1, tree 2 ceil(log2 n), pairwise 1, p2p 1).
int latency_hops(CommKind kind, Algorithm algo, int n);

// How an all_to_all's S splits over peers (StepGraph shape[1], step_graph.hpp):
//   uniform  every member sends S / n to every member;
//   by_dest  member i sends S share(j) to member j   (MoE dispatch);
//   by_src   member i sends S share(i) to every member (MoE combine), so its total is n S share(i).
enum class SplitKind : std::uint8_t { uniform, by_dest, by_src };
struct Split {
  SplitKind kind = SplitKind::uniform;
  std::vector<double> share;  // per member position; empty for uniform; sums to 1
};

// A GPU-to-GPU flow of nccl traffic (bytes as sent, before any efficiency scaling).
struct RankFlow {
  int src = 0;
  int dst = 0;
  double bytes = 0.0;
};

// The flows of one collective over `members` (ranks in group order) whose source is `only_src` (all
// sources when only_src < 0). `size` is the nccl-tests size S of the members' op (for by_src, the
// balanced size). Self flows and zero-byte flows are left out.
std::vector<RankFlow> collective_flows(CommKind kind, Algorithm algo, std::span<const int> members, double size,
                                       const Split& split, int only_src = -1);

// f(n) S, or for an all_to_all the largest bytes any member sends or receives (self excluded).
double bus_traffic_bytes(CommKind kind, std::span<const int> members, double size, const Split& split);

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
