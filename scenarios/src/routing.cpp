#include "threewalls/scenarios/routing.hpp"

#include <algorithm>
#include <cmath>

#include "threewalls/scenarios/scenario.hpp"

namespace threewalls::scenarios {

std::uint64_t Rng::next() {
  std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

double Rng::uniform() { return static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0); }

RoutingSampler::RoutingSampler(int num_layers, int num_experts, int topk, double skew, double locality,
                               std::uint64_t seed)
    : layers_(num_layers), experts_(num_experts), topk_(topk), locality_(locality), rng_(seed ^ 0x7077a11cULL) {
  cdf_.resize(static_cast<std::size_t>(layers_));
  last_.resize(static_cast<std::size_t>(layers_));
  Rng perm_rng(seed ^ 0x5eedULL);
  for (int l = 0; l < layers_; ++l) {
    std::vector<int> perm(static_cast<std::size_t>(experts_));
    for (int e = 0; e < experts_; ++e) perm[static_cast<std::size_t>(e)] = e;
    for (int i = experts_ - 1; i > 0; --i) {
      auto j = static_cast<int>(perm_rng.next() % static_cast<std::uint64_t>(i + 1));
      std::swap(perm[static_cast<std::size_t>(i)], perm[static_cast<std::size_t>(j)]);
    }
    std::vector<double> w(static_cast<std::size_t>(experts_));
    for (int r = 0; r < experts_; ++r) w[static_cast<std::size_t>(perm[static_cast<std::size_t>(r)])] = 1.0 / std::pow(r + 1.0, skew);
    auto& cdf = cdf_[static_cast<std::size_t>(l)];
    cdf.resize(w.size());
    double acc = 0;
    for (std::size_t e = 0; e < w.size(); ++e) cdf[e] = (acc += w[e]);
  }
}

RoutingSampler::RoutingSampler(const Scenario& s)
    : RoutingSampler(s.model.num_layers, std::max(1, s.model.num_experts), std::max(1, s.model.moe_router_topk),
                     s.infer ? s.infer->routing_skew : 0.0, s.infer ? s.infer->routing_locality : 0.0, s.run.seed) {}

void RoutingSampler::draw(int layer, ExpertId* out) {
  const auto& cdf = cdf_[static_cast<std::size_t>(layer)];
  for (int j = 0; j < topk_; ++j) {
    // Rejection of already chosen experts keeps it simple and exact for top-k << experts.
    for (int attempt = 0;; ++attempt) {
      double u = rng_.uniform() * cdf.back();
      auto e = static_cast<ExpertId>(std::upper_bound(cdf.begin(), cdf.end(), u) - cdf.begin());
      if (e >= experts_) e = static_cast<ExpertId>(experts_ - 1);
      bool dup = std::find(out, out + j, e) != out + j;
      if (!dup) {
        out[j] = e;
        break;
      }
      if (attempt > 64) {
        // Extremely skewed: take the first expert not chosen yet.
        for (ExpertId f = 0; f < experts_; ++f) {
          if (std::find(out, out + j, f) == out + j) {
            out[j] = f;
            break;
          }
        }
        break;
      }
    }
  }
}

RoutingSampler::StepChoices RoutingSampler::next_step(int tokens, int sequences, bool decode) {
  StepChoices sc;
  sc.tokens = tokens;
  sc.choices.resize(static_cast<std::size_t>(layers_));
  for (int l = 0; l < layers_; ++l) {
    auto& out = sc.choices[static_cast<std::size_t>(l)];
    out.assign(static_cast<std::size_t>(tokens) * topk_, 0);
    auto& last = last_[static_cast<std::size_t>(l)];
    const bool have_last = last.size() == static_cast<std::size_t>(sequences) * topk_;
    for (int t = 0; t < tokens; ++t) {
      ExpertId* dst = out.data() + static_cast<std::size_t>(t) * topk_;
      const int seq_index = t - (tokens - sequences);
      if (decode && have_last && seq_index >= 0 && rng_.uniform() < locality_) {
        std::copy_n(last.data() + static_cast<std::size_t>(seq_index) * topk_, topk_, dst);
      } else {
        draw(l, dst);
      }
    }
    // Remember the last token of every sequence.
    last.assign(static_cast<std::size_t>(sequences) * topk_, 0);
    for (int q = 0; q < sequences; ++q) {
      const int t = tokens - sequences + q;
      if (t >= 0) std::copy_n(out.data() + static_cast<std::size_t>(t) * topk_, topk_, last.data() + static_cast<std::size_t>(q) * topk_);
    }
  }
  return sc;
}

std::vector<int> RoutingSampler::StepChoices::tokens_per_expert(int layer, int num_experts) const {
  std::vector<int> counts(static_cast<std::size_t>(num_experts), 0);
  for (auto e : choices[static_cast<std::size_t>(layer)]) ++counts[static_cast<std::size_t>(e)];
  return counts;
}

}  // namespace threewalls::scenarios
