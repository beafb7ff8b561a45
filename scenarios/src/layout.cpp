#include "threewalls/scenarios/layout.hpp"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <tuple>

#include "threewalls/scenarios/scenario.hpp"
#include "threewalls/scenarios/step_graph.hpp"

namespace threewalls::scenarios {

const char* to_string(Group g) {
  switch (g) {
    case Group::none: return "none";
    case Group::tp: return "tp";
    case Group::cp: return "cp";
    case Group::dp: return "dp";
    case Group::dp_cp: return "dp_cp";
    case Group::ep: return "ep";
    case Group::etp: return "etp";
    case Group::edp: return "edp";
    case Group::pp: return "pp";
    case Group::world: return "world";
    case Group::embedding: return "embedding";
  }
  return "?";
}

Layout::Layout(int tp, int cp, int dp, int pp, int etp, int ep, int edp, int gpus_per_node)
    : tp_(tp), cp_(cp), dp_(dp), pp_(pp), etp_(etp), ep_(ep), edp_(edp), gpus_per_node_(gpus_per_node) {}

Layout::Layout(const Scenario& s)
    : Layout(s.parallel.tp, s.parallel.cp, s.parallel.dp, s.parallel.pp, s.parallel.etp, s.parallel.ep,
             s.parallel.edp, s.cluster.gpus_per_node) {}

Coords Layout::coords(int rank) const {
  Coords c;
  int r = rank;
  c.tp = r % tp_;
  r /= tp_;
  c.cp = r % cp_;
  r /= cp_;
  c.dp = r % dp_;
  r /= dp_;
  c.pp = r;
  r = rank;
  c.etp = r % etp_;
  r /= etp_;
  c.ep = r % ep_;
  r /= ep_;
  c.edp = r % edp_;
  return c;
}

namespace {
int dense_rank(int tp, int cp, int dp, int pp, int TP, int CP, int DP) { return tp + TP * (cp + CP * (dp + DP * pp)); }
int expert_rank(int etp, int ep, int edp, int pp, int ETP, int EP, int EDP) {
  return etp + ETP * (ep + EP * (edp + EDP * pp));
}
}  // namespace

int Layout::group_size(Group g) const {
  switch (g) {
    case Group::none: return 1;
    case Group::tp: return tp_;
    case Group::cp: return cp_;
    case Group::dp: return dp_;
    case Group::dp_cp: return dp_ * cp_;
    case Group::ep: return ep_;
    case Group::etp: return etp_;
    case Group::edp: return edp_;
    case Group::pp: return pp_;
    case Group::world: return world();
    case Group::embedding: return pp_ > 1 ? 2 : 1;
  }
  return 1;
}

int Layout::member(Group g, const Coords& c, int i) const {
  switch (g) {
    case Group::none: break;  // the rank itself
    case Group::tp: return dense_rank(i, c.cp, c.dp, c.pp, tp_, cp_, dp_);
    case Group::cp: return dense_rank(c.tp, i, c.dp, c.pp, tp_, cp_, dp_);
    case Group::dp: return dense_rank(c.tp, c.cp, i, c.pp, tp_, cp_, dp_);
    case Group::dp_cp: return dense_rank(c.tp, i % cp_, i / cp_, c.pp, tp_, cp_, dp_);  // cp fastest
    case Group::pp: return dense_rank(c.tp, c.cp, c.dp, i, tp_, cp_, dp_);
    case Group::etp: return expert_rank(i, c.ep, c.edp, c.pp, etp_, ep_, edp_);
    case Group::ep: return expert_rank(c.etp, i, c.edp, c.pp, etp_, ep_, edp_);
    case Group::edp: return expert_rank(c.etp, c.ep, i, c.pp, etp_, ep_, edp_);
    case Group::world: return i;
    case Group::embedding: return dense_rank(c.tp, c.cp, c.dp, i == 0 ? 0 : pp_ - 1, tp_, cp_, dp_);
  }
  return dense_rank(c.tp, c.cp, c.dp, c.pp, tp_, cp_, dp_);
}

std::vector<int> Layout::group_members(Group g, int rank) const {
  const Coords c = coords(rank);
  const int n = group_size(g);
  std::vector<int> out(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) out[static_cast<std::size_t>(i)] = member(g, c, i);
  return out;
}

int Layout::group_index(Group g, int rank) const {
  const Coords c = coords(rank);
  switch (g) {
    case Group::none: return 0;
    case Group::tp: return c.tp;
    case Group::cp: return c.cp;
    case Group::dp: return c.dp;
    case Group::dp_cp: return c.cp + cp_ * c.dp;
    case Group::pp: return c.pp;
    case Group::etp: return c.etp;
    case Group::ep: return c.ep;
    case Group::edp: return c.edp;
    case Group::world: return rank;
    case Group::embedding: return c.pp == 0 ? 0 : 1;
  }
  return 0;
}

int Layout::rank_at_stage(int rank, int stage) const {
  const Coords c = coords(rank);
  return dense_rank(c.tp, c.cp, c.dp, stage, tp_, cp_, dp_);
}

int Layout::peer_of(const Op& op, int rank) const {
  const int n = group_size(op.group);
  const int target = ((group_index(op.group, rank) + op.peer) % n + n) % n;
  return member(op.group, coords(rank), target);
}

bool Layout::group_within_node(Group g, int rank) const {
  const int node = node_of(rank);
  if (g == Group::world) return world() <= gpus_per_node_;
  const Coords c = coords(rank);
  for (int i = 0, n = group_size(g); i < n; ++i) {
    if (node_of(member(g, c, i)) != node) return false;
  }
  return true;
}

std::vector<int> refine_rank_classes(const Layout& layout, std::vector<int> color) {
  const auto n = static_cast<std::size_t>(layout.world());
  if (color.size() != n) throw std::invalid_argument("refine_rank_classes: one class id per rank expected");
  // Ids numbered by first rank: the fixed point of the loop below keeps them.
  auto renumber = [n](const std::vector<std::vector<int>>& sig) {
    std::map<std::vector<int>, int> ids;
    std::vector<int> out(n);
    for (std::size_t r = 0; r < n; ++r) out[r] = ids.emplace(sig[r], static_cast<int>(ids.size())).first->second;
    return std::pair{out, ids.size()};
  };
  std::size_t classes = 0;
  {
    std::vector<std::vector<int>> sig(n);
    for (std::size_t r = 0; r < n; ++r) sig[r] = {color[r]};
    std::tie(color, classes) = renumber(sig);
  }
  constexpr Group kSets[] = {Group::tp, Group::dp, Group::dp_cp, Group::ep, Group::etp, Group::edp};
  constexpr Group kRings[] = {Group::pp, Group::cp};
  while (true) {
    std::vector<std::vector<int>> sig(n);
    for (std::size_t r = 0; r < n; ++r) sig[r] = {color[r]};
    std::map<std::vector<int>, int> ids;  // a group's view, interned
    auto intern = [&ids](std::vector<int> v) {
      return ids.emplace(std::move(v), static_cast<int>(ids.size())).first->second;
    };
    for (const Group g : kSets) {
      if (layout.group_size(g) <= 1) continue;
      std::vector<char> seen(n, 0);
      for (std::size_t r = 0; r < n; ++r) {
        if (seen[r] != 0) continue;
        const std::vector<int> members = layout.group_members(g, static_cast<int>(r));
        std::vector<int> view;
        for (int m : members) view.push_back(color[static_cast<std::size_t>(m)]);
        std::sort(view.begin(), view.end());
        view.erase(std::unique(view.begin(), view.end()), view.end());
        view.insert(view.begin(), static_cast<int>(g));
        const int id = intern(std::move(view));
        for (int m : members) {
          seen[static_cast<std::size_t>(m)] = 1;
          sig[static_cast<std::size_t>(m)].push_back(id);
        }
      }
    }
    for (const Group g : kRings) {
      const int size = layout.group_size(g);
      if (size <= 1) continue;
      std::vector<char> seen(n, 0);
      for (std::size_t r = 0; r < n; ++r) {
        if (seen[r] != 0) continue;
        const std::vector<int> members = layout.group_members(g, static_cast<int>(r));
        for (int i = 0; i < size; ++i) {
          std::vector<int> view{static_cast<int>(g)};
          for (int k = 0; k < size; ++k)
            view.push_back(color[static_cast<std::size_t>(members[static_cast<std::size_t>((i + k) % size)])]);
          const auto m = static_cast<std::size_t>(members[static_cast<std::size_t>(i)]);
          seen[m] = 1;
          sig[m].push_back(intern(std::move(view)));
        }
      }
    }
    if (layout.group_size(Group::embedding) > 1) {
      for (std::size_t r = 0; r < n; ++r) {
        std::vector<int> view{static_cast<int>(Group::embedding)};
        for (int m : layout.group_members(Group::embedding, static_cast<int>(r)))
          view.push_back(color[static_cast<std::size_t>(m)]);
        std::sort(view.begin() + 1, view.end());
        sig[r].push_back(intern(std::move(view)));
      }
    }
    auto [next, count] = renumber(sig);
    color = std::move(next);
    if (count == classes) return color;
    classes = count;
  }
}

double RoutingModel::share(int ep_rank) const {
  if (balanced()) return 1.0 / ep_;
  if (ep_rank == 0) return imbalance_ / ep_;
  return (ep_ - imbalance_) / (static_cast<double>(ep_) * (ep_ - 1));
}

}  // namespace threewalls::scenarios
