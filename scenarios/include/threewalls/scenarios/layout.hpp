#pragma once
// Rank <-> parallel coordinates, process groups and the routing model, as Megatron-Core lays them out
// with its default order: dense ranks are tp-cp-dp-pp (tp fastest), expert ranks etp-ep-edp-pp.
#include <cstdint>
#include <vector>

namespace threewalls::scenarios {

struct Scenario;
struct Op;

enum class Group : std::uint8_t {
  none,
  tp,         // tensor parallel
  cp,         // context parallel
  dp,         // data parallel (dense)
  dp_cp,      // data x context parallel: where dense gradients are reduced
  ep,         // expert parallel
  etp,        // expert tensor parallel
  edp,        // expert data parallel: where expert gradients are reduced
  pp,         // pipeline
  world,      // every rank (gradient-norm reduction)
  embedding,  // first and last pipeline stage (tied embeddings)
};
const char* to_string(Group g);

struct Coords {
  int tp = 0, cp = 0, dp = 0, pp = 0;
  int etp = 0, ep = 0, edp = 0;
};

class Layout {
 public:
  Layout() = default;
  Layout(int tp, int cp, int dp, int pp, int etp, int ep, int edp, int gpus_per_node);
  explicit Layout(const Scenario& s);

  [[nodiscard]] int world() const { return tp_ * cp_ * dp_ * pp_; }
  [[nodiscard]] Coords coords(int rank) const;
  [[nodiscard]] int group_size(Group g) const;
  // Members of `rank`'s group `g`, ordered by their index inside the group.
  [[nodiscard]] std::vector<int> group_members(Group g, int rank) const;
  // Position of `rank` inside its group `g`.
  [[nodiscard]] int group_index(Group g, int rank) const;
  // The rank with the same dense coordinates at pipeline stage `stage`.
  [[nodiscard]] int rank_at_stage(int rank, int stage) const;
  [[nodiscard]] int stage_of(int rank) const { return coords(rank).pp; }
  // The rank that `rank` exchanges point-to-point op `op` (send or recv) with: the member of its group
  // `op.group` at index (own index + op.peer) modulo the group size. Pipeline stages (group pp, whose
  // index is the stage) and the context-parallel ring wrap. The one rule both executors and the run
  // records use.
  [[nodiscard]] int peer_of(const Op& op, int rank) const;
  [[nodiscard]] int node_of(int rank) const { return rank / gpus_per_node_; }
  [[nodiscard]] int gpus_per_node() const { return gpus_per_node_; }
  // Whether every member of `rank`'s group `g` sits on `rank`'s node.
  [[nodiscard]] bool group_within_node(Group g, int rank) const;

 private:
  // group_members(g, rank)[index] for the rank at coordinates `c` (0 <= index < group_size(g)), without
  // building the list.
  [[nodiscard]] int member(Group g, const Coords& c, int index) const;

  int tp_ = 1, cp_ = 1, dp_ = 1, pp_ = 1, etp_ = 1, ep_ = 1, edp_ = 1, gpus_per_node_ = 1;
};

// The coarsest refinement of the rank partition `color` (class id per rank, any integers) in which the
// ranks of one class cannot be told apart by their groups: for every group kind they see the same set
// of classes among their group's members, and along the point-to-point rings (pp, cp) the same classes
// at each offset from themselves. A simulator that runs one representative per class then matches the
// same collective and point-to-point instances from every member class. Returns class ids numbered by
// their first rank; a partition that already has the property keeps its classes and their order.
[[nodiscard]] std::vector<int> refine_rank_classes(const Layout& layout, std::vector<int> color);

// How routed tokens spread over the EP ranks. With imbalance f (train.routing_imbalance) EP rank 0 of
// every EP group receives f times the mean and the others share the rest evenly:
//   share(0) = f / ep,   share(i > 0) = (ep - f) / (ep (ep - 1)).
class RoutingModel {
 public:
  RoutingModel(int ep, double imbalance) : ep_(ep), imbalance_(imbalance) {}
  [[nodiscard]] double share(int ep_rank) const;
  // Tokens received by an EP rank relative to the balanced share (1 for every rank when balanced).
  [[nodiscard]] double load(int ep_rank) const { return share(ep_rank) * ep_; }
  [[nodiscard]] bool balanced() const { return imbalance_ <= 1.0 || ep_ <= 1; }

 private:
  int ep_;
  double imbalance_;
};

}  // namespace threewalls::scenarios
