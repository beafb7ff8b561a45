// The run records of a StepGraph (records/): the header's run id, the sampling config of
// run.profiler and the op -> record template (peer, group id, coarse view).
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "threewalls/core/vocabulary.hpp"
#include "threewalls/records/records.hpp"
#include "threewalls/scenarios/layout.hpp"
#include "threewalls/scenarios/loader.hpp"
#include "threewalls/scenarios/run_volume.hpp"

namespace threewalls::records {
namespace {

using scenarios::Op;
using scenarios::OpKind;
using scenarios::StepGraph;

// Two pipeline stages of a data-parallel pair, tensor parallel over two ranks: 8 ranks.
scenarios::Scenario pipeline_scenario(const std::string& profiler = "") {
  return scenarios::load_scenario_text(
             "schema_version = 1\nname = \"records_test\"\n[model]\nnum_layers = 4\nhidden_size = 512\n"
             "num_attention_heads = 8\nffn_hidden_size = 2048\nvocab_size = 32000\n[parallel]\ntp = 2\npp = 2\n"
             "[train]\nmicro_batch_size = 1\nglobal_batch_size = 8\nseq_length = 1024\n[cluster]\ngpu = \"h100\"\n"
             "gpus_per_node = 8\nnodes = 1\n" +
                 profiler,
             "records_test.toml")
      .scenario;
}

bool is_hex32(const std::string& id) {
  return id.size() == 32 &&
         std::all_of(id.begin(), id.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

TEST(Records, RunIdIsRandomForARealRunAndDerivedFromTheContentKeyOtherwise) {
  const scenarios::Scenario s = pipeline_scenario();
  const StepGraph g = scenarios::expand(s);
  const profiler::RunHeader real1 = run_header("real", s, g);
  const profiler::RunHeader real2 = run_header("real", s, g);
  EXPECT_TRUE(is_hex32(real1.run_id)) << real1.run_id;
  EXPECT_NE(real1.run_id, real2.run_id);

  const profiler::RunHeader sim1 = run_header("sim", s, g, "inputs A");
  const profiler::RunHeader sim2 = run_header("sim", s, g, "inputs A");
  const profiler::RunHeader sim3 = run_header("sim", s, g, "inputs B");
  EXPECT_TRUE(is_hex32(sim1.run_id)) << sim1.run_id;
  EXPECT_EQ(sim1.run_id, sim2.run_id);
  EXPECT_NE(sim1.run_id, sim3.run_id);
  EXPECT_EQ(sim1.run_id, profiler::content_run_id("inputs A"));

  EXPECT_EQ(sim1.source, "sim");
  EXPECT_EQ(sim1.world_size, 8);
  EXPECT_EQ(sim1.scenario.name, "records_test");
  EXPECT_EQ(sim1.scenario.hash, s.content_hash);
  EXPECT_EQ(sim1.seed, s.run.seed);
  ASSERT_EQ(sim1.rank_classes.size(), g.classes.size());
  for (std::size_t c = 0; c < g.classes.size(); ++c) EXPECT_EQ(sim1.rank_classes[c].ranks, g.classes[c].ranks);
}

TEST(Records, RepresentativesSampleOneRankPerClassSorted) {
  const scenarios::Scenario s =
      pipeline_scenario("[run.profiler]\nranks = \"representatives\"\nrecord_every_n_steps = 2\n");
  const StepGraph g = scenarios::expand(s);
  const profiler::SamplingConfig c = sampling_config(s, g);
  EXPECT_EQ(c.record_every_n_steps, 2);
  ASSERT_EQ(c.ranks.size(), g.classes.size());
  EXPECT_TRUE(std::is_sorted(c.ranks.begin(), c.ranks.end()));
  std::set<int> classes;
  for (int r : c.ranks) classes.insert(g.class_of_rank[static_cast<std::size_t>(r)]);
  EXPECT_EQ(classes.size(), g.classes.size()) << "one rank of every class";
}

// run.profiler.ranks = "auto" (the default) records every rank of a small world, one rank per class
// where every rank would write more than kAutoEveryRankMaxBytes; "all" records every rank there too.
TEST(Records, AutoRecordsEveryRankUntilTheRunDirectoryWouldPassItsBound) {
  const scenarios::Scenario small = pipeline_scenario();
  ASSERT_EQ(small.run.profiler.recorded, scenarios::RecordedRanks::automatic);
  const StepGraph gs = scenarios::expand(small);
  EXPECT_EQ(recorded_ranks(small, gs), scenarios::RecordedRanks::all);
  EXPECT_TRUE(sampling_config(small, gs).ranks.empty()) << "every rank";

  // 32,768 ranks (8,192 data-parallel replicas of the 4-rank pipeline): three recorded steps of every
  // rank pass 1 GiB.
  auto wide = [](const std::string& ranks) {
    return scenarios::load_scenario_text(
               "schema_version = 1\nname = \"records_test\"\n[model]\nnum_layers = 4\nhidden_size = 512\n"
               "num_attention_heads = 8\nffn_hidden_size = 2048\nvocab_size = 32000\n[parallel]\ntp = 2\npp = 2\n"
               "[train]\nmicro_batch_size = 1\nglobal_batch_size = 8192\nseq_length = 1024\n[cluster]\n"
               "gpu = \"h100\"\ngpus_per_node = 8\nnodes = 4096\n[run.profiler]\nrecord_every_n_steps = 1\n" +
                   ranks,
               "records_test.toml")
        .scenario;
  };
  const scenarios::Scenario big = wide("");
  const StepGraph gb = scenarios::expand(big);
  std::size_t ops = 0;
  for (const auto& rc : gb.classes) ops = std::max(ops, rc.ops.size());
  ASSERT_GT(scenarios::run_dir_bytes(scenarios::recorded_steps(big), big.world_size(), static_cast<long long>(ops)),
            scenarios::kAutoEveryRankMaxBytes);
  EXPECT_EQ(recorded_ranks(big, gb), scenarios::RecordedRanks::representatives);
  const profiler::SamplingConfig c = sampling_config(big, gb);
  EXPECT_EQ(c.ranks.size(), gb.classes.size());

  const scenarios::Scenario all = wide("ranks = \"all\"\n");
  EXPECT_EQ(recorded_ranks(all, gb), scenarios::RecordedRanks::all);
  EXPECT_TRUE(sampling_config(all, gb).ranks.empty());
}

// Every rank's records follow its class's ops one for one; a send or receive names its peer by
// Layout::peer_of, a collective its group instance by the group's lowest rank, a data-loading copy
// the host_to_device coarse view.
TEST(Records, OpRecordsCarryPeerGroupInstanceAndCoarseView) {
  const scenarios::Scenario s = pipeline_scenario();
  const StepGraph g = scenarios::expand(s);
  profiler::Names names;
  const OpRecords records(g, names);
  int sends = 0, collectives = 0, loads = 0;
  for (int rank = 0; rank < s.world_size(); ++rank) {
    const std::vector<Op>& ops = g.class_of(rank).ops;
    const std::vector<profiler::PhaseRecord> recs = records.of_rank(rank);
    ASSERT_EQ(recs.size(), ops.size());
    for (std::size_t i = 0; i < ops.size(); ++i) {
      const Op& op = ops[i];
      const profiler::PhaseRecord& r = recs[i];
      EXPECT_EQ(r.rank, rank);
      EXPECT_EQ(names.phases.name(r.phase), g.phase_name(op));
      EXPECT_EQ(r.wall, op.wall);
      if (op.kind == OpKind::send || op.kind == OpKind::recv) {
        EXPECT_EQ(r.peer, g.layout.peer_of(op, rank));
        EXPECT_NE(g.layout.stage_of(r.peer), g.layout.stage_of(rank));
        ++sends;
      } else {
        EXPECT_EQ(r.peer, profiler::kAbsent);
      }
      if (op.kind == OpKind::collective && op.group != scenarios::Group::none) {
        const std::vector<int> members = g.layout.group_members(op.group, rank);
        EXPECT_EQ(r.group_id, *std::min_element(members.begin(), members.end()));
        ++collectives;
      }
      if ((op.flags & scenarios::kDataLoad) != 0) {
        EXPECT_EQ(r.coarse, profiler::CoarseView::host_to_device);
        ++loads;
      }
    }
  }
  EXPECT_GT(sends, 0);
  EXPECT_GT(collectives, 0);
  EXPECT_GT(loads, 0);
}

TEST(Records, SummaryInputsTakeThePeakFromTheGpuTable) {
  const scenarios::Scenario s = pipeline_scenario();
  const StepGraph g = scenarios::expand(s);
  const profiler::SummaryInputs in = summary_inputs(s, g);
  EXPECT_EQ(in.gpu, "h100");
  EXPECT_EQ(in.gpu_peak.value, gpu_spec(GpuKind::h100).peak_bf16.value);
  EXPECT_DOUBLE_EQ(in.model_flops_per_step.value, g.model_flops);
  EXPECT_FALSE(inference_step(g).has_value()) << "a training graph has no inference step input";
}

}  // namespace
}  // namespace threewalls::records
