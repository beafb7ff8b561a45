#pragma once
// The seeded routing model of inference scenarios: which experts each token chooses, step by step.
// Both executors draw the same choices from it, so a simulated and a real run see the same stream of
// expert activations (and the same expert-cache hits and misses).
//
// Model: in layer l, expert popularity follows a Zipf law with exponent `skew` over a per-layer
// random permutation of the experts (skew = 0: uniform). A token draws its top-k experts without
// replacement from that distribution. In decode, each sequence keeps the experts it used at the
// previous step (per layer) with probability `locality`.
#include <cstdint>
#include <vector>

namespace threewalls::scenarios {

struct Scenario;

// Splitmix64: small, portable, deterministic.
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next();
  double uniform();  // [0, 1)

 private:
  std::uint64_t state_;
};

// An expert's index within a layer (0 .. num_experts - 1); 32-bit, so any expert count the scenario
// language accepts is representable.
using ExpertId = std::int32_t;

class RoutingSampler {
 public:
  RoutingSampler(int num_layers, int num_experts, int topk, double skew, double locality, std::uint64_t seed);
  explicit RoutingSampler(const Scenario& s);

  // Expert choices of one step: choices[layer][token * topk + j]. Tokens are position-major
  // (token = position x sequences + sequence), so the last `sequences` tokens are each sequence's
  // newest position; locality applies to them in decode steps.
  struct StepChoices {
    int tokens = 0;
    std::vector<std::vector<ExpertId>> choices;  // per layer
    // Tokens routed to each expert, per layer.
    [[nodiscard]] std::vector<int> tokens_per_expert(int layer, int num_experts) const;
  };

  // Advances to the next step. Prefill steps pass tokens = batch x prompt; decode steps tokens = batch.
  StepChoices next_step(int tokens, int sequences, bool decode);

 private:
  void draw(int layer, ExpertId* out);
  int layers_;
  int experts_;
  int topk_;
  double locality_;
  Rng rng_;
  std::vector<std::vector<double>> cdf_;  // per layer, cumulative popularity over experts
  std::vector<std::vector<ExpertId>> last_;  // per layer: previous step's choices per sequence
};

}  // namespace threewalls::scenarios
