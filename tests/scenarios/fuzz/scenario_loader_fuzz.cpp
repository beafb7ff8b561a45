// libFuzzer target for the scenario loader: arbitrary bytes -> load_scenario_text.
//
// Contract under test (scenarios/include/threewalls/scenarios/loader.hpp): for any input the loader
// either returns a scenario or throws threewalls::InputError (ScenarioError for scenario files).
// Anything else is a finding: another exception type (std::terminate -> abort), a sanitizer report
// (ASan/UBSan are fatal in this build), a hang (libFuzzer -timeout), or one of the oracles below.
// Build and run: scripts/fuzz_loader.sh SECONDS; results are recorded in docs/fuzzing.md.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "threewalls/core/error.hpp"
#include "threewalls/scenarios/loader.hpp"

namespace {

// The name the input is loaded under. Relative, so calibration.profile paths resolve against the
// working directory, as they would for a scenario file there.
constexpr const char* kFile = "fuzz_input.toml";

[[noreturn]] void finding(const char* what, const std::string& detail) {
  std::fprintf(stderr, "scenario_loader_fuzz: %s\n%s\n", what, detail.c_str());
  std::abort();
}

// Every message must start with "<file>:<line>" where line >= 1 (docs: errors name file:line:col).
void check_message(const std::string& m) {
  const std::string prefix = std::string(kFile) + ":";
  if (m.compare(0, prefix.size(), prefix) != 0) finding("error message does not start with the file name", m);
  std::size_t i = prefix.size();
  long line = 0;
  while (i < m.size() && m[i] >= '0' && m[i] <= '9' && line < 100000000) line = line * 10 + (m[i++] - '0');
  if (line < 1) finding("error message has no line number >= 1", m);
}

// Derived values a successfully loaded scenario always has (validate.cpp derives them).
void check_scenario(const threewalls::scenarios::Scenario& s) {
  const auto& p = s.parallel;
  if (p.dp < 1 || p.edp < 1) finding("loaded scenario has dp or edp < 1", s.name);
  // In double: a product of four ints may not fit 64 bits, and then it differs from the world anyway.
  if (1.0 * p.tp * p.cp * p.pp * p.dp != 1.0 * s.world_size()) finding("loaded scenario breaks tp*cp*pp*dp = world", s.name);
  if (s.model.kv_channels < 1 || s.model.num_query_groups < 1) finding("loaded scenario has no head dim/groups", s.name);
  if (s.train.has_value() == s.infer.has_value()) finding("loaded scenario is not exactly one of train/infer", s.name);
  if (s.train && s.train->num_microbatches < 1) finding("loaded scenario has no micro-batches", s.name);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    auto loaded = threewalls::scenarios::load_scenario_text(text, kFile);
    check_scenario(loaded.scenario);
  } catch (const threewalls::scenarios::ScenarioError& e) {
    if (e.messages().empty()) finding("ScenarioError without messages", "");
    for (const auto& m : e.messages()) check_message(m);
  } catch (const threewalls::InputError& e) {
    check_message(e.what());
  }
  return 0;
}
