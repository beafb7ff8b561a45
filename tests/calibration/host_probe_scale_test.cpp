// calibration::host_probe_scale: a real run's host probe over what the profile charges for
// the same calls, which `threewalls compare` prints and `threewalls sim --host-scale` takes.
#include "threewalls/calibration/host_probe_scale.hpp"

#include <gtest/gtest.h>

#include <filesystem>

#include "threewalls/calibration/profile.hpp"
#include "threewalls/core/host_probe.hpp"

namespace threewalls::calibration {
namespace {

struct Fixture {
  Profile profile = Profile::load(std::filesystem::path(THREEWALLS_SOURCE_DIR) / "calibration" / "profiles" / "h100.toml");
  CostModel model{profile};
  // What the model charges for the probe's three calls, in us, in core/host_probe.hpp's order.
  [[nodiscard]] std::vector<double> charges() const {
    std::vector<double> c{1e6 * (model.kernel_launch() + model.op_dispatch()).value};
    for (const auto& g : host_probe::kGemmCalls) c.push_back(1e6 * model.gemm_launch(g.m, g.n, g.k).value);
    return c;
  }
  [[nodiscard]] OrderedJson probe(const std::vector<double>& us) const {
    OrderedJson j = OrderedJson::object();
    j[std::string(host_probe::kOpLaunchKey)] = us[0];
    for (std::size_t i = 0; i < host_probe::kGemmCalls.size(); ++i) j[std::string(host_probe::kGemmCalls[i].key)] = us[i + 1];
    j["cpu_chain_us"] = 4.5;  // other keys of the probe are not part of the ratio
    return j;
  }
};

TEST(HostProbeScale, IsTheProbesSumOverTheProfilesChargeForTheSameCalls) {
  const Fixture f;
  const auto c = f.charges();
  ASSERT_EQ(c.size(), 3U);
  EXPECT_LT(c[1], c[2]);  // the split-K call launches a second kernel
  const auto s = host_probe_scale(f.probe({2 * c[0], 2 * c[1], 2 * c[2]}), f.model);
  ASSERT_TRUE(s.has_value());
  EXPECT_NEAR(s->scale, 2.0, 1e-9);
  EXPECT_EQ(s->keys.front(), host_probe::kOpLaunchKey);
  for (std::size_t i = 0; i < 3; ++i) EXPECT_NEAR(s->charged_us[i], c[i], 1e-9);
  // Not the mean of the three ratios: each call weighs by its time.
  const auto t = host_probe_scale(f.probe({c[0], c[1], 3 * c[2]}), f.model);
  ASSERT_TRUE(t.has_value());
  EXPECT_NEAR(t->scale, (c[0] + c[1] + 3 * c[2]) / (c[0] + c[1] + c[2]), 1e-9);
}

TEST(HostProbeScale, ChargesTheSimulationsOwnHostScale) {
  const Fixture f;
  const auto c = f.charges();
  const auto s = host_probe_scale(f.probe({2 * c[0], 2 * c[1], 2 * c[2]}), f.model, 2.0);
  ASSERT_TRUE(s.has_value());
  EXPECT_NEAR(s->scale, 1.0, 1e-9);  // a simulation already run at twice the host costs
}

TEST(HostProbeScale, APyTorchRunsProbeIsItsEagerOpAgainstLaunchAndFrameworkOp) {
  const Fixture f;
  const double charged = 1e6 * (f.model.kernel_launch() + f.model.framework_op()).value;
  OrderedJson p = OrderedJson::object();
  p[std::string(host_probe::kTorchEagerOpKey)] = 1.5 * charged;
  const auto s = host_probe_scale(p, f.model);
  ASSERT_TRUE(s.has_value());
  EXPECT_NEAR(s->scale, 1.5, 1e-9);
  ASSERT_EQ(s->keys.size(), 1U);
  EXPECT_EQ(s->keys[0], host_probe::kTorchEagerOpKey);
  p[std::string(host_probe::kTorchEagerOpKey)] = 0.0;
  EXPECT_FALSE(host_probe_scale(p, f.model).has_value());
}

TEST(HostProbeScale, NothingForAnIncompleteOrBadProbe) {
  const Fixture f;
  const auto c = f.charges();
  OrderedJson missing = f.probe(c);
  missing.erase(std::string(host_probe::kGemmCalls[1].key));
  EXPECT_FALSE(host_probe_scale(missing, f.model).has_value());
  OrderedJson text = f.probe(c);
  text[std::string(host_probe::kOpLaunchKey)] = "fast";
  EXPECT_FALSE(host_probe_scale(text, f.model).has_value());
  EXPECT_FALSE(host_probe_scale(f.probe({-1.0, c[1], c[2]}), f.model).has_value());
  EXPECT_FALSE(host_probe_scale(OrderedJson(nullptr), f.model).has_value());
  EXPECT_FALSE(host_probe_scale(f.probe(c), f.model, 0.0).has_value());
}

}  // namespace
}  // namespace threewalls::calibration
