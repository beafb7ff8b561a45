// What `threewalls sim` prints: the model and layout lines, throughput per GPU, the dominant wall,
// "memory-bound" time apart from memory capacity, the largest peak against the GPU's memory, no float
// noise, and inference steps split into prefill and decode (docs/simulator.md).
#include <regex>
#include <string>

#include <gtest/gtest.h>

#include "../scenarios/test_support.hpp"

namespace threewalls::cli {
namespace {

namespace st = threewalls::scenarios::testing;

const std::string kCli = THREEWALLS_CLI_PATH;
const std::string kSource = THREEWALLS_SOURCE_DIR;

std::string sim_summary(const std::string& example, const std::string& flags) {
  const auto r = st::run_command("(" + kCli + " sim " + st::shell_quote(kSource + "/scenarios/examples/" + example) +
                                     " --no-run-dir " + flags + " 2>&1)",
                                 false);
  EXPECT_EQ(r.exit_code, 0) << r.out;
  return r.out;
}

bool has(const std::string& out, const std::string& re) { return std::regex_search(out, std::regex(re)); }

TEST(SimSummary, TrainingLinesAMegatronUserReads) {
  const std::string out = sim_summary("small_moe_ep2.toml", "--steps 1 --fidelity analytic");
  EXPECT_TRUE(has(
      out, R"(\nmodel +[0-9.]+ [BM] parameters, [0-9.]+ [BM] active per token \(\d+ layers, \d+ experts, top-\d+\)\n)"))
      << out;
  EXPECT_TRUE(has(
      out,
      R"(\nlayout +TP 1, CP 1, PP 1, VPP 1, DP 2; EP 2, ETP 1 \(expert DP 1\); \d+ micro-batch(es)? of \d+ x \d+ tokens per DP rank \(global batch \d+\)\n)"))
      << out;
  EXPECT_TRUE(has(out, R"(\nthroughput +\d+ tokens/s \([0-9.]+ per GPU\), )")) << out;
  EXPECT_TRUE(has(out, R"(\n  memory-bound  )")) << out;
  EXPECT_FALSE(has(out, R"(\n  memory  )")) << out;  // the time wall is never called just "memory"
  EXPECT_TRUE(has(out, R"(\ndominant wall  (compute|memory-bound|communication|host|bubble) [0-9.]+%\n)")) << out;
  EXPECT_TRUE(has(out, R"(\nmemory capacity \(peak per rank class, GPU [0-9.]+ GiB\)\n)")) << out;
  EXPECT_TRUE(has(out, R"(\nmax memory +[0-9.]+ [GM]iB per GPU of [0-9.]+ GiB \([0-9.]+%; class \d+, )")) << out;
  EXPECT_FALSE(has(out, R"(\de-\d)")) << out;  // no exponent: float noise prints as 0
}

TEST(SimSummary, InferenceSeparatesPrefillAndDecode) {
  const std::string out = sim_summary("deepseek_v2_lite_offload.toml", "--steps 3 --fidelity analytic");
  EXPECT_TRUE(has(out, R"(\nprefill +[0-9.]+ [mu]?s per step \(1 step; critical rank 0\), [0-9.]+ tokens/s)")) << out;
  EXPECT_TRUE(has(out, R"(\ndecode +[0-9.]+ [mu]?s per step \(median of 2 steps; critical rank 0\), )")) << out;
  EXPECT_TRUE(has(out, R"(\nwalls \(critical path, mean per step\)  prefill +decode\n)")) << out;
  EXPECT_TRUE(has(out, R"(\ndominant wall  prefill: \S+ [0-9.]+%; decode: \S+ [0-9.]+%\n)")) << out;
  EXPECT_FALSE(has(out, R"(\nstep time )")) << out;  // no single step time mixing the two kinds
}

}  // namespace
}  // namespace threewalls::cli
