#include "threewalls/sim/flows.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <stdexcept>
#include <unordered_map>
#include <utility>

namespace threewalls::sim {

const char* to_string(Algorithm a) {
  switch (a) {
    case Algorithm::ring: return "ring";
    case Algorithm::tree: return "tree";
    case Algorithm::chain: return "chain";
    case Algorithm::pairwise: return "pairwise";
    case Algorithm::p2p: return "p2p";
  }
  return "?";
}

const char* to_string(AllReduceChoice a) {
  switch (a) {
    case AllReduceChoice::automatic: return "auto";
    case AllReduceChoice::ring: return "ring";
    case AllReduceChoice::tree: return "tree";
  }
  return "?";
}

double bus_factor(Collective kind, int n) {
  if (n <= 1) return 0.0;
  const double nn = n;
  switch (kind) {
    case Collective::all_reduce: return 2.0 * (nn - 1.0) / nn;
    case Collective::all_gather:
    case Collective::reduce_scatter:
    case Collective::all_to_all: return (nn - 1.0) / nn;
    case Collective::broadcast:
    case Collective::send_recv: return 1.0;
  }
  return 1.0;
}

Algorithm choose_algorithm(Collective kind, AllReduceChoice choice, bool spans_nodes, double bytes, int n) {
  switch (kind) {
    case Collective::all_reduce:
      if (choice == AllReduceChoice::ring || n <= 2) return Algorithm::ring;
      if (choice == AllReduceChoice::tree) return Algorithm::tree;
      return (spans_nodes && bytes / n <= kTreeMaxBytesPerMember) ? Algorithm::tree : Algorithm::ring;
    case Collective::all_gather:
    case Collective::reduce_scatter: return Algorithm::ring;
    case Collective::broadcast: return Algorithm::chain;
    case Collective::all_to_all: return Algorithm::pairwise;
    case Collective::send_recv: return Algorithm::p2p;
  }
  return Algorithm::ring;
}

int latency_hops(Collective kind, Algorithm algo, int n) {
  if (n <= 1) return 0;
  switch (algo) {
    case Algorithm::ring: return kind == Collective::all_reduce ? 2 * (n - 1) : n - 1;
    case Algorithm::chain: return n - 1;
    case Algorithm::tree: return 2 * static_cast<int>(std::ceil(std::log2(static_cast<double>(n))));
    case Algorithm::pairwise:
    case Algorithm::p2p: return 1;
  }
  return 1;
}

namespace {

// Bytes member position i sends to position j (i != j) in an all_to_all.
double a2a_bytes(std::size_t i, std::size_t j, std::size_t n, double size, const Split& split) {
  switch (split.kind) {
    case SplitKind::uniform: return size / static_cast<double>(n);
    case SplitKind::by_dest: return size * split.share.at(j);
    case SplitKind::by_src: return size * split.share.at(i);
  }
  return 0.0;
}

void check_split(const Split& split, std::size_t n) {
  if (split.kind != SplitKind::uniform && split.share.size() != n) {
    throw std::logic_error("all_to_all split has " + std::to_string(split.share.size()) + " shares for " +
                           std::to_string(n) + " members");
  }
}

}  // namespace

namespace {

// The lowest and highest node of a non-empty group.
std::pair<int, int> node_range(std::span<const int> members, int gpus_per_node) {
  int lo = members.front() / gpus_per_node, hi = lo;
  for (int r : members) {
    lo = std::min(lo, r / gpus_per_node);
    hi = std::max(hi, r / gpus_per_node);
  }
  return {lo, hi};
}

}  // namespace

int rails_of(std::span<const int> members, int gpus_per_node) {
  if (gpus_per_node <= 1 || members.size() <= 1) return 1;
  const auto [lo, hi] = node_range(members, gpus_per_node);
  if (lo == hi) return 1;
  // Members per node: the rails when every node of the group has as many.
  std::vector<int> count(static_cast<std::size_t>(hi - lo) + 1, 0);
  for (int r : members) ++count[static_cast<std::size_t>(r / gpus_per_node - lo)];
  int per = 0;
  for (const int c : count) {
    if (c == 0) continue;
    if (per == 0) per = c;
    if (c != per) return 1;
  }
  return per;
}

double rails_bus_time(double traffic, int rails, double network_busbw, double nvlink_busbw) {
  if (!(traffic > 0.0) || !(network_busbw > 0.0)) return 0.0;
  if (rails <= 1) return traffic / network_busbw;
  const double l = rails;
  const double t_net = traffic / l / network_busbw;
  const double t_nv = nvlink_busbw > 0.0 ? traffic * (l - 1.0) / l / nvlink_busbw : 0.0;
  return std::max(t_net, t_nv);
}

namespace {

// The channels of a ring, chain or tree across nodes with `rails` members per node (collective_flows).
void add_rail_flows(Collective kind, std::span<const int> members, double size, int rails, int gpus_per_node,
                    int only_src, std::vector<RankFlow>& out) {
  const std::size_t n = members.size();
  const double nn = static_cast<double>(n);
  const double per = kind == Collective::broadcast    ? size
                     : kind == Collective::all_reduce ? 2.0 * (nn - 1.0) / nn * size
                                                      : (nn - 1.0) / nn * size;
  // Nodes in order of first appearance (`order`; index_of: by node id less the lowest, its position
  // in it), each with its members in group order.
  const auto [lo, hi] = node_range(members, gpus_per_node);
  std::vector<int> index_of(static_cast<std::size_t>(hi - lo) + 1, -1);
  auto slot = [&](int r) -> int& { return index_of[static_cast<std::size_t>(r / gpus_per_node - lo)]; };
  std::vector<int> order;
  for (int r : members) {
    if (slot(r) < 0) {
      slot(r) = static_cast<int>(order.size());
      order.push_back(r / gpus_per_node);
    }
  }
  const double l = rails;
  auto add = [&](const std::vector<int>& here, const std::vector<int>& next) {
    for (std::size_t p = 0; p < here.size(); ++p) {
      const int src = here[p];
      if (only_src >= 0 && src != only_src) continue;
      out.push_back({src, here[(p + 1) % here.size()], per * (l - 1.0) / l});
      out.push_back({src, next[p], per / l});
    }
  };
  if (only_src >= 0 && std::count(members.begin(), members.end(), only_src) == 1) {
    // Its flows go within its node and to the next node only.
    auto members_of = [&](int node) {
      std::vector<int> v;
      for (int r : members) {
        if (r / gpus_per_node == node) v.push_back(r);
      }
      return v;
    };
    const auto k = static_cast<std::size_t>(slot(only_src));
    add(members_of(order[k]), members_of(order[(k + 1) % order.size()]));
    return;
  }
  std::vector<std::vector<int>> locals(order.size());
  for (int r : members) locals[static_cast<std::size_t>(slot(r))].push_back(r);
  for (std::size_t k = 0; k < locals.size(); ++k) add(locals[k], locals[(k + 1) % locals.size()]);
}

}  // namespace

std::vector<RankFlow> collective_flows(Collective kind, Algorithm algo, std::span<const int> members, double size,
                                       const Split& split, int only_src, int gpus_per_node) {
  std::vector<RankFlow> out;
  const std::size_t n = members.size();
  if (n <= 1 || !(size > 0.0)) return out;
  if (gpus_per_node > 0 && (algo == Algorithm::ring || algo == Algorithm::chain || algo == Algorithm::tree)) {
    if (const int rails = rails_of(members, gpus_per_node); rails > 1) {
      add_rail_flows(kind, members, size, rails, gpus_per_node, only_src, out);
      return out;
    }
  }
  auto add = [&](std::size_t i, std::size_t j, double bytes) {
    const int s = members[i];
    const int d = members[j];
    if (s == d || !(bytes > 0.0)) return;
    if (only_src >= 0 && s != only_src) return;
    out.push_back({s, d, bytes});
  };
  const double nn = static_cast<double>(n);
  // The position of only_src when it is one member of `members` (n otherwise): a ring, chain or tree
  // then visits only the positions whose flows add() keeps, in the same order.
  std::size_t src = n;
  if (only_src >= 0 && std::count(members.begin(), members.end(), only_src) == 1) {
    src = static_cast<std::size_t>(std::find(members.begin(), members.end(), only_src) - members.begin());
  }
  const std::size_t first = src < n ? src : 0, last = src < n ? src + 1 : n;  // the sources to visit
  switch (algo) {
    case Algorithm::ring: {
      const double per = (kind == Collective::all_reduce ? 2.0 : 1.0) * (nn - 1.0) / nn * size;
      for (std::size_t i = first; i < last; ++i) add(i, (i + 1) % n, per);
      break;
    }
    case Algorithm::chain:
      for (std::size_t i = first; i < last && i + 1 < n; ++i) add(i, i + 1, size);
      break;
    case Algorithm::tree:
      for (std::size_t shift = 0; shift < 2; ++shift) {
        auto edge = [&](std::size_t p) {
          const std::size_t child = (p + shift) % n;
          const std::size_t parent = ((p - 1) / 2 + shift) % n;
          add(child, parent, size / 2.0);
          add(parent, child, size / 2.0);
        };
        if (src < n) {
          // The source is the child of p = q and the parent of p = 2q + 1 and 2q + 2 (q < 2q + 1).
          const std::size_t q = (src + n - shift) % n;
          if (q >= 1) edge(q);
          for (std::size_t p = 2 * q + 1; p <= 2 * q + 2 && p < n; ++p) edge(p);
          continue;
        }
        for (std::size_t p = 1; p < n; ++p) edge(p);
      }
      break;
    case Algorithm::pairwise:
      check_split(split, n);
      for (std::size_t i = first; i < last; ++i) {
        for (std::size_t j = 0; j < n; ++j) {
          if (i != j) add(i, j, a2a_bytes(i, j, n, size, split));
        }
      }
      break;
    case Algorithm::p2p:
      add(0, 1, size);
      break;
  }
  return out;
}

double bus_traffic_bytes(Collective kind, std::span<const int> members, double size, const Split& split) {
  const std::size_t n = members.size();
  if (n <= 1) return 0.0;
  if (kind != Collective::all_to_all || split.kind == SplitKind::uniform) {
    return bus_factor(kind, static_cast<int>(n)) * size;
  }
  check_split(split, n);
  double worst = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    double out = 0.0;
    double in = 0.0;
    for (std::size_t j = 0; j < n; ++j) {
      if (j == i) continue;
      out += a2a_bytes(i, j, n, size, split);
      in += a2a_bytes(j, i, n, size, split);
    }
    worst = std::max({worst, out, in});
  }
  return worst;
}

namespace {

// Probability that none of k draws without replacement from `total` items hits one of `marked`.
double none_drawn(double total, double marked, int k) {
  double p = 1.0;
  for (int t = 0; t < k; ++t) {
    const double left = total - t;
    if (left <= 0.0) return 0.0;
    p *= std::max(0.0, left - marked) / left;
  }
  return p;
}

}  // namespace

double node_use_probability(const ExpertDispatch& d, int node_experts) {
  const double e = d.num_experts;
  const double m = node_experts;
  if (!(e > 0.0) || m <= 0 || d.topk <= 0) return 0.0;
  if (m >= e) return 1.0;
  const int groups = d.num_groups;
  if (groups > 1 && d.group_topk > 0 && d.num_experts % groups == 0) {
    const int per_group = d.num_experts / groups;
    if (node_experts % per_group == 0) {
      return 1.0 - none_drawn(groups, static_cast<double>(node_experts / per_group), d.group_topk);
    }
    if (per_group % node_experts == 0) {
      const double candidates = static_cast<double>(d.group_topk) * per_group;
      return static_cast<double>(d.group_topk) / groups * (1.0 - none_drawn(candidates, m, d.topk));
    }
  }
  return 1.0 - none_drawn(e, m, d.topk);
}

double dedup_factor(const ExpertDispatch& d, std::span<const int> experts_per_node, std::size_t own) {
  if (d.num_experts <= 0 || d.topk <= 0) return 1.0;
  double nodes = 0.0;
  double copies = 0.0;
  for (std::size_t m = 0; m < experts_per_node.size(); ++m) {
    if (m == own) continue;
    nodes += node_use_probability(d, experts_per_node[m]);
    copies += static_cast<double>(d.topk) * experts_per_node[m] / d.num_experts;
  }
  if (!(copies > 0.0)) return 1.0;
  return std::clamp(nodes / copies, 0.0, 1.0);
}

double rdma_count_factor(const ExpertDispatch& d, std::span<const int> experts_per_node, std::size_t own) {
  double all = 0.0;
  double others = 0.0;
  for (std::size_t m = 0; m < experts_per_node.size(); ++m) {
    const double p = node_use_probability(d, experts_per_node[m]);
    all += p;
    if (m != own) others += p;
  }
  return others > 0.0 ? all / others : 1.0;
}

std::vector<int> members_per_node(std::span<const int> members, const Platform& platform,
                                  std::vector<int>* node_of_member) {
  std::vector<int> per_node;
  std::map<int, int> index;  // platform node -> node index in member order
  if (node_of_member) node_of_member->resize(members.size());
  for (std::size_t i = 0; i < members.size(); ++i) {
    const auto [it, added] = index.try_emplace(platform.node_of(members[i]), static_cast<int>(index.size()));
    if (added) per_node.push_back(0);
    if (node_of_member) (*node_of_member)[i] = it->second;
    ++per_node[static_cast<std::size_t>(it->second)];
  }
  return per_node;
}

A2aByLink a2a_by_link(std::span<const int> members, double size, const Split& split, const Platform& platform,
                      std::span<const double> dedup) {
  const std::size_t n = members.size();
  check_split(split, n);
  A2aByLink out;
  out.members.resize(n);
  std::vector<int> node_of;
  out.members_per_node = members_per_node(members, platform, &node_of);
  for (std::size_t i = 0; i < n; ++i) out.members[i].node = node_of[i];
  if (!dedup.empty() && dedup.size() != out.members_per_node.size()) {
    throw std::logic_error("a2a_by_link: " + std::to_string(dedup.size()) + " dedup factors for " +
                           std::to_string(out.members_per_node.size()) + " nodes");
  }
  const bool flex = !dedup.empty();
  std::vector<double> intra_out(n, 0.0), intra_in(n, 0.0), net_out(n, 0.0), net_in(n, 0.0), raw_in(n, 0.0);
  for (std::size_t i = 0; i < n; ++i) {
    const int ni = out.members[i].node;
    const double f = flex ? dedup[static_cast<std::size_t>(ni)] : 1.0;
    for (std::size_t j = 0; j < n; ++j) {
      if (j == i) continue;
      const double b = a2a_bytes(i, j, n, size, split);
      if (out.members[j].node == ni) {
        intra_out[i] += b;
        intra_in[j] += b;
      } else {
        net_out[i] += b * f;
        net_in[j] += b * f;
        raw_in[j] += b;
      }
    }
  }
  for (std::size_t i = 0; i < n; ++i) {
    const double fwd = flex ? raw_in[i] : 0.0;
    out.members[i].nvlink = std::max(intra_out[i] + fwd, intra_in[i] + fwd);
    out.members[i].network = std::max(net_out[i], net_in[i]);
  }
  return out;
}

std::vector<RankFlow> aggregate_flows(std::span<const RankFlow> flows, std::span<const int> members,
                                      const Platform& platform) {
  // Position of each member in the group order (the first one of a rank listed twice), for "the
  // first destination after the source": (rank, position) sorted, searched by rank.
  std::vector<std::pair<int, std::size_t>> pos(members.size());
  for (std::size_t i = 0; i < members.size(); ++i) pos[i] = {members[i], i};
  std::sort(pos.begin(), pos.end());
  const std::size_t n = members.size();
  auto position = [&](int rank) {
    const auto it = std::lower_bound(pos.begin(), pos.end(), std::pair<int, std::size_t>{rank, 0});
    return it != pos.end() && it->first == rank ? it->second : n;
  };
  struct Bucket {
    int src = 0;
    int cls = 0;  // 0 same node, 1 same leaf, 2 other leaf
    double bytes = 0.0;
    int dst = -1;
    std::size_t dist = 0;  // distance after the source in group order of the chosen destination
  };
  // A few buckets per source (the flows of one member's op have one source): searched in place.
  std::vector<Bucket> buckets;
  for (const RankFlow& f : flows) {
    int cls = 2;
    if (platform.node_of(f.src) == platform.node_of(f.dst)) {
      cls = 0;
    } else if (platform.leaf_of(f.src) == platform.leaf_of(f.dst)) {
      cls = 1;
    }
    auto b =
        std::find_if(buckets.begin(), buckets.end(), [&](const Bucket& x) { return x.src == f.src && x.cls == cls; });
    if (b == buckets.end()) b = buckets.insert(buckets.end(), Bucket{f.src, cls});
    b->bytes += f.bytes;
    const std::size_t ps = position(f.src);
    const std::size_t pd = position(f.dst);
    const std::size_t dist = (ps < n && pd < n) ? (pd + n - ps) % n : 0;
    if (b->dst < 0 || dist < b->dist) {
      b->dst = f.dst;
      b->dist = dist;
    }
  }
  // By source, then class.
  std::sort(buckets.begin(), buckets.end(), [](const Bucket& x, const Bucket& y) {
    return std::pair{x.src, x.cls} < std::pair{y.src, y.cls};
  });
  std::vector<RankFlow> out;
  out.reserve(buckets.size());
  for (const Bucket& b : buckets) out.push_back({b.src, b.dst, b.bytes});
  return out;
}

std::vector<double> max_min_rates(std::span<const PlacedFlow> flows, std::span<const double> capacity) {
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<double> rate(flows.size(), inf);
  // Links used, their remaining capacity and unfrozen flow count.
  std::map<std::uint32_t, std::pair<double, int>> links;
  for (const PlacedFlow& f : flows) {
    for (std::uint32_t l : f.links) {
      auto [it, inserted] = links.try_emplace(l, capacity[l], 0);
      ++it->second.second;
    }
  }
  std::vector<bool> frozen(flows.size(), false);
  for (std::size_t i = 0; i < flows.size(); ++i) {
    if (flows[i].links.empty()) frozen[i] = true;
  }
  while (true) {
    double best = inf;
    std::uint32_t best_link = 0;
    for (const auto& [l, st] : links) {
      if (st.second <= 0) continue;
      const double share = std::max(0.0, st.first) / st.second;
      if (share < best) {
        best = share;
        best_link = l;
      }
    }
    if (best == inf) break;
    for (std::size_t i = 0; i < flows.size(); ++i) {
      if (frozen[i]) continue;
      const auto& fl = flows[i].links;
      if (std::find(fl.begin(), fl.end(), best_link) == fl.end()) continue;
      frozen[i] = true;
      rate[i] = best;
      for (std::uint32_t l : fl) {
        auto& st = links[l];
        st.first -= best;
        --st.second;
      }
    }
  }
  return rate;
}

double lone_makespan(std::span<const PlacedFlow> flows, std::span<const double> capacity) {
  std::vector<PlacedFlow> active(flows.begin(), flows.end());
  double t = 0.0;
  while (!active.empty()) {
    const std::vector<double> rate = max_min_rates(active, capacity);
    double dt = std::numeric_limits<double>::infinity();
    for (std::size_t i = 0; i < active.size(); ++i) dt = std::min(dt, active[i].bytes / rate[i]);
    if (!std::isfinite(dt)) break;  // flows without links take no time
    t += dt;
    std::vector<PlacedFlow> left;
    for (std::size_t i = 0; i < active.size(); ++i) {
      const double rest = active[i].bytes - rate[i] * dt;
      if (rest > 1e-9 * active[i].bytes + 1e-12) {
        left.push_back(active[i]);
        left.back().bytes = rest;
      }
    }
    active.swap(left);
  }
  return t;
}

}  // namespace threewalls::sim
