// The executor (on the fake device) and the simulator (analytic fidelity) write the same phase
// records for the same scenario: same keys, same fields (docs/formats/run_dir.md).
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <tuple>

#include <unistd.h>

#include "threewalls/backend/executor.hpp"
#include "threewalls/backend/fake_device.hpp"
#include "threewalls/profiler/run_dir.hpp"
#include "threewalls/scenarios/loader.hpp"
#include "threewalls/sim/simulator.hpp"

namespace threewalls::backend {
namespace {

namespace fs = std::filesystem;
using Key = std::tuple<int, int, std::string, int, int, int>;

// Key -> the optional fields a record carries (the mandatory ones are always there), their values,
// wall and stream.
std::map<Key, std::string> records(const fs::path& dir) {
  const profiler::RunData d = profiler::RunDirReader::read(dir);
  std::map<Key, std::string> out;
  for (const auto& p : d.phases) {
    std::string f;
    if (p.expert != profiler::kAbsent) f += " expert";
    if (p.peer != profiler::kAbsent) f += " peer=" + std::to_string(p.peer);
    if (p.group != profiler::kNoName) f += " group=" + d.names.groups.name(p.group);
    if (p.group_id != profiler::kAbsent) f += " group_id=" + std::to_string(p.group_id);
    if (p.tokens != profiler::kAbsent) f += " tokens=" + std::to_string(p.tokens);
    if (p.coarse != profiler::CoarseView::none) f += std::string(" coarse=") + profiler::to_string(p.coarse);
    f += std::string(" wall=") + profiler::to_string(p.wall) + " stream=" + d.names.streams.name(p.stream);
    out[{p.step, p.rank, d.names.phases.name(p.phase), p.layer, p.microbatch, p.expert}] = f;
  }
  return out;
}

void expect_same_records(const std::string& name, const std::string& text_or_path, bool is_path) {
  const scenarios::Scenario s = is_path ? scenarios::load_scenario(text_or_path)
                                        : scenarios::load_scenario_text(text_or_path, name + ".toml").scenario;
  const fs::path base = fs::temp_directory_path() / ("tw_simkeys_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(base);
  const int steps = 2;

  sim::SimOptions so;
  so.fidelity = sim::Fidelity::analytic;
  so.steps = steps;
  so.out_dir = base / "sim";
  sim::simulate(s, "auto", so);

  FakeDeviceOptions fo;
  fo.max_op_us = 20.0;
  FakeFabric fabric(fo);
  ProcessContext pc;
  for (int r = 0; r < s.world_size(); ++r) pc.local_ranks.push_back(r);
  pc.make_comm_ids = [&fabric](std::size_t n) { return fabric.make_ids(n); };
  ExecutorOptions eo;
  eo.steps = steps;
  eo.warmup_steps = 0;
  eo.out_dir = base / "real";
  execute(s, pc, [&fabric](int rank, int) { return std::make_unique<FakeDevice>(fabric, rank); }, eo);

  const auto a = records(base / "sim");
  const auto b = records(base / "real");
  ASSERT_FALSE(a.empty());
  std::size_t shown = 0;
  for (const auto& [k, f] : a) {
    const auto it = b.find(k);
    if (it == b.end()) {
      ADD_FAILURE() << name << ": only in the simulator's run: " << std::get<2>(k) << " step " << std::get<0>(k)
                    << " rank " << std::get<1>(k) << " layer " << std::get<3>(k);
    } else if (it->second != f) {
      ADD_FAILURE() << name << ": " << std::get<2>(k) << " layer " << std::get<3>(k) << ": sim" << f << " | real"
                    << it->second;
    }
    if (++shown > 2000) break;
  }
  for (const auto& [k, f] : b) {
    if (a.count(k) == 0) ADD_FAILURE() << name << ": only in the real run: " << std::get<2>(k) << " step " << std::get<0>(k);
  }
  fs::remove_all(base);
}

TEST(ExecutorVsSimulator, ExampleScenariosRecordTheSameKeysAndFields) {
  for (const char* name : {"small_moe_1gpu", "small_moe_ep2", "small_moe_ep4", "small_moe_tp2_ep2"}) {
    expect_same_records(name, (fs::path(THREEWALLS_SOURCE_DIR) / "scenarios" / "examples" / (std::string(name) + ".toml")).string(),
                        true);
  }
}

TEST(ExecutorVsSimulator, PipelineAndInferenceScenariosRecordTheSameKeysAndFields) {
  const std::string model =
      "[model]\nnum_layers = 4\nhidden_size = 256\nnum_attention_heads = 4\nvocab_size = 1024\nnum_experts = 4\n"
      "moe_ffn_hidden_size = 256\nmoe_router_topk = 2\n";
  expect_same_records("pp2", "schema_version = 1\nname = \"pp2\"\n" + model +
                                 "[parallel]\npp = 2\n[train]\nmicro_batch_size = 1\nglobal_batch_size = 4\n"
                                 "seq_length = 256\noverlap_grad_reduce = true\n[cluster]\ngpu = \"h100\"\n"
                                 "gpus_per_node = 2\nnodes = 1\n[run.profiler]\nrecord_every_n_steps = 1\n",
                      false);
  expect_same_records("infer", "schema_version = 1\nname = \"infer\"\n" + model +
                                   "[infer]\nbatch_size = 2\nprompt_length = 64\ngenerate_tokens = 2\n"
                                   "sync_routing_stats = true\n[cluster]\ngpu = \"h100\"\ngpus_per_node = 1\nnodes = 1\n"
                                   "[run.profiler]\nrecord_every_n_steps = 1\n",
                      false);
}

}  // namespace
}  // namespace threewalls::backend
