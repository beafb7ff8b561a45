#include "threewalls/profiler/run_dir.hpp"

#include <gtest/gtest.h>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>

#include "test_util.hpp"
#include "threewalls/core/error.hpp"

using namespace threewalls;
using namespace threewalls::profiler;
using threewalls::profiler::testing::fresh_dir;
using threewalls::profiler::testing::slurp;
using threewalls::profiler::testing::spit;
namespace fs = std::filesystem;

namespace {

RunHeader header(int world) {
  RunHeader h = make_header("sim", world);
  h.scenario = {"tiny \"quoted\"", "scenarios/examples/tiny.toml", "0123456789abcdef"};
  h.calibration_profile = ProfileId{"h100-test", "profiles/h100.toml", "h100"};
  h.device = "simulated h100";
  h.argv = {"threewalls", "sim", "tiny.toml"};
  h.seed = 42;
  h.settings["fidelity"] = "des";
  h.rank_classes = {{0, "stage 0", {0, 2}, 0}, {1, "stage 1", {1, 3}, 1}};
  return h;
}

SamplingPolicy every_step(int world, std::vector<int> ranks = {}) {
  SamplingConfig c;
  c.record_every_n_steps = 1;
  c.flush_every_n_steps = 1;
  c.ranks = std::move(ranks);
  return SamplingPolicy(c, world);
}

// Writes `steps` steps of a small synthetic timeline for every rank the writer records.
void fill(RunDirWriter& w, int steps, int first = 0) {
  auto attn = w.phase_id("attn_qkv_fwd");
  auto a2a = w.phase_id("moe_dispatch_fwd");
  auto recv = w.phase_id("pp_recv_fwd");
  auto compute = w.stream_id("compute");
  auto comm = w.stream_id("ep_comm");
  auto ep = w.group_id("ep");
  auto pp = w.group_id("pp");
  for (int s = first; s < first + steps; ++s) {
    for (int r = 0; r < w.policy().world_size(); ++r) {
      if (!w.records(s, r)) continue;
      PhaseRecord p;
      p.step = s;
      p.rank = r;
      p.phase = attn;
      p.stream = compute;
      p.layer = 3;
      p.microbatch = 1;
      p.start_us = 1.5;
      p.dur_us = 100.25 + r;
      p.bytes = 1.5e9;
      p.flops = 3.25e12;
      p.launch_wait_us = 12.5F;
      w.add(p);
      PhaseRecord q = p;
      q.phase = a2a;
      q.stream = comm;
      q.wall = Wall::communication;
      q.start_us = 101.75 + r;
      q.dur_us = 50.0;
      q.expert = 2;
      q.group = ep;
      q.group_id = r & ~1;
      q.tokens = 4096;
      q.flops = 0;
      q.launch_wait_us = 0.0F;
      w.add(q);
      PhaseRecord x = p;
      x.phase = recv;
      x.stream = comm;
      x.wall = Wall::communication;
      x.layer = kAbsent;
      x.microbatch = kAbsent;
      x.peer = r ^ 1;
      x.group = pp;
      x.coarse = CoarseView::host_to_device;
      x.start_us = 0;
      x.dur_us = 1;
      x.launch_wait_us = 0.0F;
      w.add(x);
      w.add(StepRecord{s, r, 1e9 + s * 1000.0 + 0.125, 160.0 + r});
    }
    w.end_step(s);
  }
}

std::string read_error(const fs::path& dir, ReadOptions o = {}) {
  try {
    (void)RunDirReader::read(dir, o);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

// Writes a complete 2-rank run and returns its directory.
fs::path write_run(const fs::path& dir, int steps = 2) {
  RunDirWriter w(dir, header(4), every_step(4, {0, 1}));
  fill(w, steps);
  w.close();
  return dir;
}

void replace_in(const fs::path& p, const std::string& from, const std::string& to) {
  std::string s = slurp(p);
  auto i = s.find(from);
  ASSERT_NE(i, std::string::npos) << from;
  s.replace(i, from.size(), to);
  spit(p, s);
}

// `dir` rewritten as a file of an older schema `version` ("1.0", "1.1"): no run_id, no step_end lines.
fs::path as_version(const fs::path& dir, const std::string& version) {
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name != "run.json" && name.rfind("phases_rank_", 0) != 0) continue;
    std::string text = slurp(e.path());
    std::string out;
    std::size_t pos = 0;
    while (pos < text.size()) {
      std::size_t nl = text.find('\n', pos);
      if (nl == std::string::npos) nl = text.size();
      std::string line = text.substr(pos, nl - pos);
      pos = nl + 1;
      if (line.find("\"record\":\"step_end\"") != std::string::npos) continue;
      for (const std::string key : {"\"run_id\":\"", "\"run_id\": \""}) {
        const auto at = line.find(key);
        if (at == std::string::npos) continue;
        const auto end = line.find('"', at + key.size());
        std::size_t stop = end + 1;
        if (stop < line.size() && line[stop] == ',') ++stop;
        line.erase(at, stop - at);
      }
      for (const std::string key : {"\"schema_version\":\"1.2\"", "\"schema_version\": \"1.2\""}) {
        const auto at = line.find(key);
        if (at != std::string::npos) line.replace(at, key.size(), key.substr(0, key.size() - 4) + version + "\"");
      }
      out += line + "\n";
    }
    spit(e.path(), out);
  }
  return dir;
}

// The least summary.json a reader accepts for the run of `h`.
OrderedJson minimal_summary(const RunHeader& h) {
  OrderedJson s = OrderedJson::object();
  s["schema"] = "threewalls.run_dir";
  s["schema_version"] = "1.2";
  s["run_id"] = h.run_id;
  s["source"] = h.source;
  s["scenario"] = OrderedJson{{"name", h.scenario.name}, {"path", h.scenario.path}, {"hash", h.scenario.hash}};
  s["world_size"] = h.world_size;
  s["gpu"] = "h100";
  s["steps"] = OrderedJson::array({OrderedJson{{"step", 0}, {"step_time_us", 160.0}}});
  s["step_time_us"] = OrderedJson{{"median", 160.0}};
  s["memory"] = OrderedJson{{"classes", OrderedJson::array({OrderedJson{{"peak_bytes", 1e9}}})}};
  return s;
}

}  // namespace

TEST(RunDir, WriterReaderRoundTripKeepsEveryField) {
  auto dir = fresh_dir();
  RunDirWriter w(dir, header(4), every_step(4));
  fill(w, 3);
  w.close();
  EXPECT_EQ(w.phase_records_written(), 3U * 4U * 3U);

  RunData d = RunDirReader::read(dir);
  EXPECT_TRUE(d.warnings.empty());
  EXPECT_EQ(d.header.source, "sim");
  EXPECT_EQ(d.header.scenario.name, "tiny \"quoted\"");
  EXPECT_EQ(d.header.calibration_profile->id, "h100-test");
  EXPECT_EQ(d.header.world_size, 4);
  EXPECT_EQ(d.header.seed, 42U);
  EXPECT_EQ(d.header.ranks, (std::vector<int>{0, 1, 2, 3}));
  ASSERT_EQ(d.header.rank_classes.size(), 2U);
  EXPECT_EQ(d.header.rank_classes[1].ranks, (std::vector<int>{1, 3}));
  EXPECT_EQ(d.header.settings["profiler"]["record_every_n_steps"], 1);
  EXPECT_EQ(d.rank_headers.at(3)["rank_class"], 1);
  EXPECT_EQ(d.schema_major, 1);

  ASSERT_EQ(d.phases.size(), w.kept_phases().size());
  ASSERT_EQ(d.steps.size(), w.kept_steps().size());
  // The reader orders by rank then file order; the writer kept arrival order (step, rank).
  auto key = [](const PhaseRecord& p) { return std::make_tuple(p.rank, p.step, p.start_us, p.dur_us); };
  auto kept = w.kept_phases();
  std::stable_sort(kept.begin(), kept.end(), [&](const auto& a, const auto& b) { return key(a) < key(b); });
  auto read = d.phases;
  std::stable_sort(read.begin(), read.end(), [&](const auto& a, const auto& b) { return key(a) < key(b); });
  for (std::size_t i = 0; i < kept.size(); ++i) {
    const auto& a = kept[i];
    const auto& b = read[i];
    EXPECT_EQ(a.step, b.step);
    EXPECT_EQ(a.rank, b.rank);
    EXPECT_EQ(w.names().phases.name(a.phase), d.names.phases.name(b.phase));
    EXPECT_EQ(w.names().streams.name(a.stream), d.names.streams.name(b.stream));
    EXPECT_EQ(a.layer, b.layer);
    EXPECT_EQ(a.microbatch, b.microbatch);
    EXPECT_DOUBLE_EQ(a.start_us, b.start_us);
    EXPECT_DOUBLE_EQ(a.dur_us, b.dur_us);
    EXPECT_EQ(a.wall, b.wall);
    EXPECT_DOUBLE_EQ(a.bytes, b.bytes);
    EXPECT_DOUBLE_EQ(a.flops, b.flops);
    EXPECT_EQ(a.expert, b.expert);
    EXPECT_EQ(a.peer, b.peer);
    EXPECT_EQ(a.group == kNoName, b.group == kNoName);
    if (a.group != kNoName) {
      EXPECT_EQ(w.names().groups.name(a.group), d.names.groups.name(b.group));
    }
    EXPECT_EQ(a.group_id, b.group_id);
    EXPECT_EQ(a.tokens, b.tokens);
    EXPECT_FLOAT_EQ(a.launch_wait_us, b.launch_wait_us);
    EXPECT_EQ(a.coarse, b.coarse);
  }
  for (const auto& s : d.steps) {
    EXPECT_DOUBLE_EQ(s.epoch_us, 1e9 + s.step * 1000.0 + 0.125);
    EXPECT_DOUBLE_EQ(s.dur_us, 160.0 + s.rank);
  }
}

// More recorded ranks than the process may keep files open (here 300 ranks under a limit of 64 open
// files, in a child process, whose limits are its own): every rank file is complete.
TEST(RunDir, MoreRankFilesThanTheOpenFileLimitAreWrittenWhole) {
  const fs::path dir = fresh_dir("_many_rank_files");
  constexpr int kRanks = 300;
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    rlimit lim{64, 64};
    if (::setrlimit(RLIMIT_NOFILE, &lim) != 0) ::_exit(3);
    try {
      RunDirWriter w(dir, header(kRanks), every_step(kRanks));
      fill(w, 2);
      w.close();
    } catch (...) {
      ::_exit(2);
    }
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0) << "the writer failed under a limit of 64 open files";
  const RunData d = RunDirReader::read(dir);
  EXPECT_TRUE(d.warnings.empty());
  EXPECT_EQ(d.rank_headers.size(), static_cast<std::size_t>(kRanks));
  EXPECT_EQ(d.phases.size(), 3U * 2U * kRanks);
  EXPECT_EQ(d.steps.size(), 2U * kRanks);
}

TEST(RunDir, DisabledWritesNothing) {
  auto dir = fresh_dir();
  SamplingConfig c;
  c.enabled = false;
  RunDirWriter w(dir, header(4), SamplingPolicy(c, 4));
  fill(w, 3);
  w.write_summary(OrderedJson{{"x", 1}});
  w.close();
  EXPECT_FALSE(fs::exists(dir));
  EXPECT_EQ(w.phase_records_written(), 0U);
  EXPECT_TRUE(w.kept_phases().empty());
}

TEST(RunDir, RefusesToOverwriteANonEmptyRunDirectory) {
  auto dir = write_run(fresh_dir());
  try {
    RunDirWriter w(dir, header(4), every_step(4));
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("never overwritten"), std::string::npos) << e.what();
  }
  // An existing empty directory is fine.
  auto empty = fresh_dir("_empty");
  fs::create_directories(empty);
  RunDirWriter ok(empty, header(4), every_step(4));
  ok.close();
  EXPECT_TRUE(fs::exists(empty / "phases_rank_3.jsonl"));
}

TEST(RunDir, OverwriteReplacesEveryRunFileButKeepsOthers) {
  auto dir = fresh_dir();
  {
    RunDirWriter w(dir, header(4), every_step(4));
    fill(w, 1);
    w.close();
  }
  spit(dir / "notes.txt", "mine");
  WriterOptions o;
  o.overwrite = true;
  RunDirWriter w(dir, header(4), every_step(4, {0}), o);
  fill(w, 1);
  w.close();
  EXPECT_FALSE(fs::exists(dir / "phases_rank_1.jsonl"));  // stale rank files of the old run are gone
  EXPECT_TRUE(fs::exists(dir / "notes.txt"));
  RunData d = RunDirReader::read(dir);
  EXPECT_EQ(d.header.ranks, (std::vector<int>{0}));
}

TEST(RunDir, SamplingDropsUnselectedStepsRanksAndGranularity) {
  auto dir = fresh_dir();
  SamplingConfig c;
  c.start_step = 1;
  c.record_every_n_steps = 2;
  c.ranks = {2};
  c.granularity = Granularity::coarse;
  RunDirWriter w(dir, header(4), SamplingPolicy(c, 4));
  PhaseRecord p;
  p.phase = w.phase_id("x");
  p.stream = w.stream_id("compute");
  p.rank = 2;
  p.step = 0;
  EXPECT_FALSE(w.add(p));  // step not sampled
  p.step = 1;
  EXPECT_FALSE(w.add(p));  // not in the coarse view
  p.coarse = CoarseView::training_metrics;
  EXPECT_TRUE(w.add(p));
  p.rank = 1;
  EXPECT_FALSE(w.add(p));  // rank does not record
  EXPECT_TRUE(w.add(StepRecord{1, 2, 0.0, 5.0}));
  EXPECT_FALSE(w.add(StepRecord{2, 2, 0.0, 5.0}));
  w.close();
  EXPECT_EQ(fs::exists(dir / "phases_rank_1.jsonl"), false);
  RunData d = RunDirReader::read(dir);
  EXPECT_EQ(d.phases.size(), 1U);
  EXPECT_EQ(d.steps.size(), 1U);
  EXPECT_EQ(d.header.settings["profiler"]["granularity"], "coarse");
  EXPECT_NE(slurp(dir / "phases_rank_2.jsonl").find(R"("records":1,"steps":[1]})"), std::string::npos);
}

TEST(RunDir, FlushWritesBufferedRecordsAfterTheFlushStep) {
  auto dir = fresh_dir();
  SamplingConfig c;
  c.record_every_n_steps = 1;
  c.flush_every_n_steps = 2;
  c.ranks = {0};
  RunDirWriter w(dir, header(4), SamplingPolicy(c, 4));
  auto lines = [&] {
    auto s = slurp(dir / "phases_rank_0.jsonl");
    return std::count(s.begin(), s.end(), '\n');
  };
  EXPECT_EQ(lines(), 1);  // the header reaches the disk at once
  fill(w, 1);             // step 0: not a flush step
  EXPECT_EQ(lines(), 1);
  fill(w, 1, 1);  // step 1: flushes steps 0 and 1 (4 records and a step_end line each)
  EXPECT_EQ(lines(), 1 + 2 * 5);
  fill(w, 1, 2);
  EXPECT_EQ(lines(), 1 + 2 * 5);
  w.close();
  EXPECT_EQ(lines(), 1 + 3 * 5 + 1);
}

TEST(RunDir, DestructorWithoutCloseKeepsRecordsButWritesNoFooter) {
  auto dir = fresh_dir();
  {
    RunDirWriter w(dir, header(4), every_step(4, {0}));
    auto p = PhaseRecord{};
    p.phase = w.phase_id("x");
    p.stream = w.stream_id("s");
    w.add(p);
    w.add(StepRecord{0, 0, 0.0, 1.0});
  }  // e.g. an exception unwinds the training loop
  auto err = read_error(dir);
  EXPECT_NE(err.find("phases_rank_0.jsonl: no footer record"), std::string::npos) << err;
  ReadOptions o;
  o.allow_incomplete = true;
  RunData d = RunDirReader::read(dir, o);
  EXPECT_EQ(d.phases.size(), 0U);  // the step never ended: not kept as whole
  ASSERT_EQ(d.warnings.size(), 3U);
  EXPECT_NE(d.warnings[0].find("no footer"), std::string::npos);
  EXPECT_NE(d.warnings[1].find("step 0 was cut short"), std::string::npos) << d.warnings[1];
  EXPECT_NE(d.warnings[2].find("kept 0 whole step(s); dropped 1"), std::string::npos) << d.warnings[2];
}

TEST(RunDir, TruncatedLineIsReportedWithFileAndLine) {
  auto dir = write_run(fresh_dir());
  auto p = dir / "phases_rank_1.jsonl";
  std::string s = slurp(p);
  // Cut line 3 in the middle (and keep the rest of the file after it).
  std::size_t line3 = s.find('\n', s.find('\n') + 1) + 1;
  s.erase(line3 + 40, s.find('\n', line3) - (line3 + 40));
  spit(p, s);
  auto err = read_error(dir);
  EXPECT_NE(err.find("phases_rank_1.jsonl:3:"), std::string::npos) << err;
  EXPECT_NE(err.find("corrupt or truncated"), std::string::npos) << err;
  // A corrupt line that is not the last one is an error even when incomplete files are allowed.
  ReadOptions o;
  o.allow_incomplete = true;
  EXPECT_NE(read_error(dir, o).find("phases_rank_1.jsonl:3:"), std::string::npos);
}

TEST(RunDir, TruncatedLastLineOfACrashedRunIsDroppedOnlyWhenAllowed) {
  auto dir = write_run(fresh_dir());
  auto p = dir / "phases_rank_0.jsonl";
  std::string s = slurp(p);
  s.erase(s.rfind("{\"record\":\"footer\""));  // the crash: no footer ...
  s.erase(s.rfind("{\"record\":\"step\""));   // ... and the last step record cut halfway
  s += R"({"record":"step","step":1,"ra)";
  spit(p, s);
  auto err = read_error(dir);
  EXPECT_NE(err.find("phases_rank_0.jsonl:"), std::string::npos) << err;
  EXPECT_NE(err.find("corrupt or truncated"), std::string::npos) << err;
  ReadOptions o;
  o.allow_incomplete = true;
  RunData d = RunDirReader::read(dir, o);
  // Step 1 never finished on rank 0: only step 0 is kept, on both ranks.
  EXPECT_EQ(d.phases.size(), 3U + 3U);
  ASSERT_EQ(d.warnings.size(), 5U);
  EXPECT_NE(d.warnings[0].find("phases_rank_0.jsonl:"), std::string::npos) << d.warnings[0];
  EXPECT_NE(d.warnings[0].find("corrupt last line dropped"), std::string::npos) << d.warnings[0];
  EXPECT_NE(d.warnings[1].find("no footer"), std::string::npos) << d.warnings[1];
  EXPECT_NE(d.warnings[2].find("step 1 was cut short (no step_end record): its 3 phase records dropped"),
            std::string::npos)
      << d.warnings[2];
  EXPECT_NE(d.warnings[3].find("phases_rank_1.jsonl: 1 step record(s) and 3 phase records of steps cut short on "
                               "another rank dropped"),
            std::string::npos)
      << d.warnings[3];
  EXPECT_NE(d.warnings[4].find("kept 1 whole step(s); dropped 1 step(s) cut short (1)"), std::string::npos)
      << d.warnings[4];
}

TEST(RunDir, MissingFooterIsReported) {
  auto dir = write_run(fresh_dir());
  auto p = dir / "phases_rank_1.jsonl";
  std::string s = slurp(p);
  s.erase(s.rfind("{\"record\":\"footer\""));
  spit(p, s);
  auto err = read_error(dir);
  EXPECT_NE(err.find("phases_rank_1.jsonl: no footer record: the file was cut short"), std::string::npos) << err;
}

TEST(RunDir, UnknownMajorVersionIsRefusedByName) {
  auto dir = write_run(fresh_dir());
  replace_in(dir / "run.json", "\"schema_version\": \"1.2\"", "\"schema_version\": \"2.0\"");
  auto err = read_error(dir);
  EXPECT_NE(err.find("run.json: schema threewalls.run_dir version 2.0 is newer than this threewalls reads (1.x)"),
            std::string::npos)
      << err;
  // Same for a phases file header.
  dir = write_run(fresh_dir("_rank"));
  replace_in(dir / "phases_rank_0.jsonl", "\"schema_version\":\"1.2\"", "\"schema_version\":\"3.1\"");
  err = read_error(dir);
  EXPECT_NE(err.find("phases_rank_0.jsonl:1: schema threewalls.run_dir version 3.1 is newer"), std::string::npos) << err;
  // And a file that is not a run directory at all.
  dir = write_run(fresh_dir("_name"));
  replace_in(dir / "run.json", "\"threewalls.run_dir\"", "\"threewalls.calibration_profile\"");
  EXPECT_NE(read_error(dir).find("is not a run directory"), std::string::npos);
}

TEST(RunDir, NewerMinorVersionIsReadAndItsNewFieldsIgnored) {
  auto dir = write_run(fresh_dir());
  replace_in(dir / "run.json", "\"schema_version\": \"1.2\"", "\"schema_version\": \"1.7\"");
  auto p = dir / "phases_rank_0.jsonl";
  replace_in(p, "\"schema_version\":\"1.2\"", "\"schema_version\":\"1.7\"");
  replace_in(p, "\"flops\":", "\"sm_occupancy_pct\":87.5,\"flops\":");
  RunData d = RunDirReader::read(dir);
  EXPECT_EQ(d.schema_minor, 7);
  EXPECT_EQ(d.phases.size(), 12U);
}

TEST(RunDir, UnknownFieldInACurrentVersionFileIsAnError) {
  auto dir = write_run(fresh_dir());
  replace_in(dir / "phases_rank_0.jsonl", "\"flops\":", "\"flop\":1,\"flops\":");
  auto err = read_error(dir);
  EXPECT_NE(err.find("phases_rank_0.jsonl:2: unknown field 'flop' in a version 1.2 file"), std::string::npos) << err;
}

TEST(RunDir, LaunchWaitIsASchema11FieldWrittenOnlyWhereNonZero) {
  auto dir = write_run(fresh_dir());
  const std::string text = slurp(dir / "phases_rank_0.jsonl");
  EXPECT_NE(text.find("\"launch_wait_us\":12.5"), std::string::npos);
  EXPECT_EQ(text.find("\"launch_wait_us\":0"), std::string::npos) << "zero waits are left out";
  // A 1.0 file (written before the field existed) that carries it is refused, by name.
  dir = as_version(dir, "1.0");
  auto err = read_error(dir);
  EXPECT_NE(err.find("phases_rank_0.jsonl:2: field 'launch_wait_us' is new in schema 1.1; this file says 1.0"),
            std::string::npos)
      << err;
  // A wait longer than its record is an error.
  dir = write_run(fresh_dir("_long"));
  replace_in(dir / "phases_rank_1.jsonl", "\"launch_wait_us\":12.5", "\"launch_wait_us\":1000");
  err = read_error(dir);
  EXPECT_NE(err.find("phases_rank_1.jsonl:2: launch_wait_us exceeds dur_us"), std::string::npos) << err;
}

TEST(RunDir, BadWallValueNamesTheAllowedValues) {
  auto dir = write_run(fresh_dir());
  replace_in(dir / "phases_rank_1.jsonl", "\"wall\":\"compute\"", "\"wall\":\"gpu\"");
  auto err = read_error(dir);
  EXPECT_NE(err.find("phases_rank_1.jsonl:2: field 'wall' is \"gpu\"; allowed: compute, memory, communication, host"),
            std::string::npos)
      << err;
}

TEST(RunDir, MissingFieldIsNamed) {
  auto dir = write_run(fresh_dir());
  replace_in(dir / "phases_rank_0.jsonl", ",\"dur_us\":100.25", "");
  auto err = read_error(dir);
  EXPECT_NE(err.find("phases_rank_0.jsonl:2: phase record lacks field(s) 'dur_us'"), std::string::npos) << err;
}

TEST(RunDir, FooterCountThatDisagreesIsAnError) {
  auto dir = write_run(fresh_dir());
  replace_in(dir / "phases_rank_0.jsonl", "\"records\":6", "\"records\":7");
  auto err = read_error(dir);
  EXPECT_NE(err.find("footer says 7 phase records, the file holds 6"), std::string::npos) << err;
}

TEST(RunDir, RecordAfterTheFooterIsAnError) {
  auto dir = write_run(fresh_dir());
  std::string s = slurp(dir / "phases_rank_0.jsonl");
  spit(dir / "phases_rank_0.jsonl", s + R"({"record":"step","step":5,"rank":0,"epoch_us":0,"dur_us":1})" + "\n");
  EXPECT_NE(read_error(dir).find("record after the footer"), std::string::npos);
}

TEST(RunDir, MissingOrUnlistedRankFileIsAnError) {
  auto dir = write_run(fresh_dir());
  fs::rename(dir / "phases_rank_1.jsonl", dir / "phases_rank_2.jsonl");
  auto err = read_error(dir);
  EXPECT_NE(err.find("phases_rank_1.jsonl: missing; run.json lists rank 1 as recording"), std::string::npos) << err;
  fs::copy_file(dir / "phases_rank_2.jsonl", dir / "phases_rank_1.jsonl");
  err = read_error(dir);
  EXPECT_NE(err.find("rank 2 is not among run.json's recording ranks"), std::string::npos) << err;
}

TEST(RunDir, RecordOfAnotherRankIsAnError) {
  auto dir = write_run(fresh_dir());
  replace_in(dir / "phases_rank_1.jsonl", "{\"step\":0,\"rank\":1,", "{\"step\":0,\"rank\":0,");
  auto err = read_error(dir);
  EXPECT_NE(err.find("phases_rank_1.jsonl:2: record of rank 0 in the file of rank 1"), std::string::npos) << err;
}

TEST(RunDir, MissingRunJsonIsNotARunDirectory) {
  auto dir = write_run(fresh_dir());
  fs::remove(dir / "run.json");
  EXPECT_NE(read_error(dir).find("run.json: missing; not a run directory"), std::string::npos);
  EXPECT_NE(read_error(dir / "nope").find("no such directory"), std::string::npos);
}

TEST(RunDir, SummaryJsonIsReadAndVersionChecked) {
  auto dir = fresh_dir();
  RunDirWriter w(dir, header(4), every_step(4, {0}));
  fill(w, 1);
  w.close();
  OrderedJson summary = minimal_summary(w.header());
  summary["schema_version"] = "1.0";
  summary["x"] = 1;
  w.write_summary(summary);
  RunData d = RunDirReader::read(dir);
  ASSERT_TRUE(d.summary.has_value());
  EXPECT_EQ((*d.summary)["x"], 1);
  replace_in(dir / "summary.json", "\"1.0\"", "\"9.0\"");
  EXPECT_NE(read_error(dir).find("summary.json: schema threewalls.run_dir version 9.0 is newer"), std::string::npos);
}

TEST(RunDir, JoinModeAddsRankFilesToAnExistingRun) {
  auto dir = fresh_dir();
  WriterOptions o0;
  o0.local_ranks = {0};
  RunDirWriter w0(dir, header(2), every_step(2), o0);
  WriterOptions o1;
  o1.mode = WriterOptions::Mode::join;
  o1.local_ranks = {1};
  o1.write_run_json = false;
  RunDirWriter w1(dir, header(2), every_step(2), o1);
  fill(w0, 1);
  fill(w1, 1);
  w0.close();
  w1.close();
  RunData d = RunDirReader::read(dir);
  EXPECT_EQ(d.phases.size(), 6U);
  WriterOptions bad;
  bad.mode = WriterOptions::Mode::join;
  EXPECT_THROW(RunDirWriter(dir / "absent", header(2), every_step(2), bad), InputError);
}

TEST(RunDir, TimesAreWrittenRoundedToTheNanosecondAndCountsToIntegers) {
  Names n;
  PhaseRecord p;
  p.phase = n.phases.intern("a\"b");
  p.stream = n.streams.intern("compute");
  p.start_us = -0.0015;
  p.dur_us = 12.34567;
  p.bytes = 4096;
  p.flops = 1.5;  // counts are written as integers
  std::string line;
  append_phase_line(line, p, n);
  EXPECT_EQ(line,
            R"({"step":0,"rank":0,"phase":"a\"b","layer":null,"microbatch":null,"stream":"compute","start_us":-0.002,)"
            R"("dur_us":12.346,"wall":"compute","bytes":4096,"flops":2})");
  line.clear();
  p.bytes = 1e20;  // beyond 2^53: nine significant digits
  append_phase_line(line, p, n);
  EXPECT_NE(line.find(R"("bytes":1e+20,)"), std::string::npos) << line;
  line.clear();
  append_step_line(line, StepRecord{3, 1, 1234567890.1234, 100.0});
  EXPECT_EQ(line, R"({"record":"step","step":3,"rank":1,"epoch_us":1234567890.123,"dur_us":100})");
}

TEST(RunDir, LongNamesAndExtremeValuesRoundTrip) {
  auto dir = fresh_dir();
  SamplingConfig c;
  c.record_every_n_steps = 1;
  RunDirWriter w(dir, header(1), SamplingPolicy(c, 1));
  PhaseRecord p;
  const std::string long_name(5000, 'x');
  p.phase = w.phase_id(long_name);
  p.stream = w.stream_id(std::string(3000, 's') + "\"\\\n");
  p.group = w.group_id(std::string(2000, 'g'));
  p.group_id = 2147483647;
  p.start_us = -1e13;  // beyond the nanosecond formatter's range
  p.dur_us = 1e15;
  p.bytes = 1e300;
  p.flops = 9.1e15;
  p.tokens = 1LL << 52;
  w.add(p);
  w.add(StepRecord{0, 0, 1e14, 2e15});
  w.close();
  RunData d = RunDirReader::read(dir);
  ASSERT_EQ(d.phases.size(), 1U);
  const auto& q = d.phases[0];
  EXPECT_EQ(d.names.phases.name(q.phase), long_name);
  EXPECT_EQ(d.names.streams.name(q.stream), std::string(3000, 's') + "\"\\\n");
  EXPECT_EQ(q.group_id, 2147483647);
  EXPECT_DOUBLE_EQ(q.start_us, -1e13);
  EXPECT_DOUBLE_EQ(q.dur_us, 1e15);
  EXPECT_NEAR(q.bytes, 1e300, 1e292);
  EXPECT_NEAR(q.flops, 9.1e15, 1e7);
  EXPECT_EQ(q.tokens, 1LL << 52);
  EXPECT_DOUBLE_EQ(d.steps[0].epoch_us, 1e14);
}

TEST(RunDirPaths, ScenarioNameBecomesOneSafePathComponent) {
  EXPECT_EQ(run_dir_name("mixtral_8x7b-v1.2"), "mixtral_8x7b-v1.2");
  EXPECT_EQ(run_dir_name("../../../../tmp/x"), "_.._.._.._tmp_x");
  EXPECT_EQ(run_dir_name(".."), "run");
  EXPECT_EQ(run_dir_name(""), "run");
  EXPECT_EQ(run_dir_name("/etc/passwd"), "_etc_passwd");
  EXPECT_EQ(run_dir_name("a b\\c\nd"), "a_b_c_d");
  EXPECT_EQ(run_dir_name(std::string(100000, 'n')), std::string(96, 'n'));
  const fs::path under = fs::path("out") / "sim" / run_dir_name("../../x");
  EXPECT_EQ(under.parent_path(), fs::path("out") / "sim");
}

TEST(RunDirPaths, OverwriteRefusesADirectoryThatIsNotARunDirectory) {
  auto dir = fresh_dir();
  fs::create_directories(dir);
  spit(dir / "thesis.tex", "mine");
  spit(dir / "summary.json", "{}");  // a run file's name alone does not make a run directory
  WriterOptions o;
  o.overwrite = true;
  try {
    RunDirWriter w(dir, header(4), every_step(4), o);
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("is not a run directory (it has no run.json"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("nothing was removed"), std::string::npos) << e.what();
  }
  EXPECT_EQ(slurp(dir / "summary.json"), "{}");
  EXPECT_TRUE(fs::exists(dir / "thesis.tex"));
  EXPECT_FALSE(is_run_dir(dir));
  EXPECT_TRUE(is_run_dir(write_run(fresh_dir("_run"))));
}

TEST(RunDirPaths, ASecondWriterIsRefusedWhileTheFirstHoldsTheLock) {
  auto dir = fresh_dir();
  WriterOptions o;
  o.overwrite = true;
  {
    RunDirWriter first(dir, header(4), every_step(4), o);
    EXPECT_TRUE(fs::exists(dir / std::string(kRunDirLockFile)));
    fill(first, 1);
    try {
      RunDirWriter second(dir, header(4), every_step(4), o);
      FAIL() << "no error";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("another threewalls process is writing this run directory"),
                std::string::npos)
          << e.what();
    }
    fill(first, 1, 1);
    first.close();
  }
  // The holder removed the lock file; the run it wrote is whole, and a later writer may replace it.
  EXPECT_FALSE(fs::exists(dir / std::string(kRunDirLockFile)));
  EXPECT_EQ(RunDirReader::read(dir).steps.size(), 8U);
  RunDirWriter later(dir, header(4), every_step(4), o);
  later.close();
}

TEST(RunDirPaths, AFileOrANameTheSystemRefusesIsAClearError) {
  auto message = [](const fs::path& p) {
    try {
      check_run_dir_target(p, true);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message("/dev/null").find("/dev/null: exists and is not a directory"), std::string::npos);
  const fs::path longest = fresh_dir() / std::string(100000, 'n');
  const std::string m = message(longest);
  EXPECT_NE(m.find("cannot be used as a run directory: File name too long"), std::string::npos) << m.substr(0, 300);
  EXPECT_NE(m.find("(a path of "), std::string::npos) << m.substr(0, 300);
  EXPECT_LT(m.size(), 400U);
  EXPECT_THROW(RunDirWriter(longest, header(4), every_step(4)), InputError);
}

TEST(RunDirSteps, EveryStepEndsWithItsRecordCountAndFilesNameTheirRun) {
  auto dir = write_run(fresh_dir());
  const std::string text = slurp(dir / "phases_rank_0.jsonl");
  EXPECT_NE(text.find("{\"record\":\"step_end\",\"step\":0,\"records\":3}\n"), std::string::npos) << text;
  EXPECT_NE(text.find("{\"record\":\"step_end\",\"step\":1,\"records\":3}\n"), std::string::npos) << text;
  RunData d = RunDirReader::read(dir);
  ASSERT_EQ(d.header.run_id.size(), 32U);
  EXPECT_NE(
      text.find("\"record\":\"header\",\"schema\":\"threewalls.run_dir\",\"schema_version\":\"1.2\",\"run_id\":\"" +
                d.header.run_id + "\""),
      std::string::npos);
  EXPECT_NE(text.find("{\"record\":\"footer\",\"run_id\":\"" + d.header.run_id + "\",\"records\":6"),
            std::string::npos);
  EXPECT_NE(RunDirReader::read(write_run(fresh_dir("_other"))).header.run_id, d.header.run_id);
  // A count that disagrees, a missing step_end in a closed file, a record after its step's end.
  replace_in(dir / "phases_rank_0.jsonl", "\"step\":1,\"records\":3}", "\"step\":1,\"records\":2}");
  EXPECT_NE(read_error(dir).find("step_end of step 1 says 2 phase records, the file holds 3"), std::string::npos)
      << read_error(dir);
  replace_in(dir / "phases_rank_0.jsonl", "{\"record\":\"step_end\",\"step\":1,\"records\":2}\n", "");
  EXPECT_NE(read_error(dir).find("footer: step 1 has no step_end record"), std::string::npos) << read_error(dir);
  dir = write_run(fresh_dir("_after"));
  replace_in(dir / "phases_rank_1.jsonl", "{\"step\":1,\"rank\":1,", "{\"step\":0,\"rank\":1,");
  EXPECT_NE(read_error(dir).find("phases_rank_1.jsonl:7: a record of step 0 after its step_end record"),
            std::string::npos)
      << read_error(dir);
}

TEST(RunDirSteps, APartialStepIsNeverKeptEvenWithAllowIncomplete) {
  auto dir = fresh_dir();
  {
    RunDirWriter w(dir, header(4), every_step(4, {0, 1}));
    fill(w, 2);
    // Step 2 starts as a simulator writes it (step record first), then the process dies mid-step.
    w.add(StepRecord{2, 0, 3e9, 160.0});
    PhaseRecord p;
    p.step = 2;
    p.rank = 0;
    p.phase = w.phase_id("attn_qkv_fwd");
    p.stream = w.stream_id("compute");
    p.dur_us = 1;
    w.add(p);
    w.end_step(1);  // flushes what is buffered
  }
  EXPECT_NE(read_error(dir).find("no footer record"), std::string::npos);
  ReadOptions o;
  o.allow_incomplete = true;
  RunData d = RunDirReader::read(dir, o);
  EXPECT_EQ(d.steps.size(), 4U);  // steps 0 and 1 of both ranks
  EXPECT_EQ(d.phases.size(), 12U);
  EXPECT_EQ(d.dropped_steps, (std::vector<int>{2}));
  std::string all;
  for (const auto& w : d.warnings) all += w + "\n";
  EXPECT_NE(all.find("step 2 was cut short (no step_end record): its step record and 1 phase records dropped"),
            std::string::npos)
      << all;
  EXPECT_NE(all.find("kept 2 whole step(s); dropped 1 step(s) cut short (2)"), std::string::npos) << all;

  // A file cut inside a step: that step is dropped on every rank, not only on the rank cut short.
  dir = write_run(fresh_dir("_cut"), 3);
  std::string t = slurp(dir / "phases_rank_1.jsonl");
  t = t.substr(0, t.find("{\"step\":1,") + 40);  // a torn line inside step 1
  spit(dir / "phases_rank_1.jsonl", t);
  d = RunDirReader::read(dir, o);
  EXPECT_EQ(d.dropped_steps, (std::vector<int>{1, 2}));
  for (const auto& s : d.steps) EXPECT_EQ(s.step, 0) << s.rank;
  for (const auto& p : d.phases) EXPECT_EQ(p.step, 0) << p.rank;

  // A schema 1.1 file cannot tell whether its last step is whole: that step is dropped.
  dir = as_version(write_run(fresh_dir("_old"), 3), "1.1");
  t = slurp(dir / "phases_rank_0.jsonl");
  spit(dir / "phases_rank_0.jsonl", t.substr(0, t.find("{\"record\":\"footer\"")));
  d = RunDirReader::read(dir, o);
  EXPECT_EQ(d.dropped_steps, (std::vector<int>{2}));
}

TEST(RunDirCorruption, AStepRecordWithZeroDurationIsAnError) {
  auto dir = write_run(fresh_dir());
  replace_in(dir / "phases_rank_0.jsonl", ",\"dur_us\":160}", ",\"dur_us\":0}");
  EXPECT_NE(read_error(dir).find("phases_rank_0.jsonl:5: step record: field 'dur_us' is 0; allowed: > 0"),
            std::string::npos)
      << read_error(dir);
}

TEST(RunDirCorruption, RanksBeyondAnIntAreErrorsNotTruncated) {
  auto dir = write_run(fresh_dir());
  replace_in(dir / "phases_rank_0.jsonl", "\"rank\":0,\"rank_class\"", "\"rank\":4294967296,\"rank_class\"");
  EXPECT_NE(read_error(dir).find("header rank 4294967296 does not match the file name (rank 0)"), std::string::npos)
      << read_error(dir);
  dir = write_run(fresh_dir("_name"));
  fs::copy_file(dir / "phases_rank_0.jsonl", dir / "phases_rank_4294967296.jsonl");
  EXPECT_NE(read_error(dir).find("phases_rank_4294967296.jsonl: rank 4294967296 in the file name is out of range"),
            std::string::npos)
      << read_error(dir);
  dir = write_run(fresh_dir("_list"));
  std::string run = slurp(dir / "run.json");
  const auto at = run.find("\n  \"ranks\": [");  // run.json's own, not the profiler settings'
  ASSERT_NE(at, std::string::npos);
  run.insert(at + 13, "4294967296, ");
  spit(dir / "run.json", run);
  EXPECT_NE(read_error(dir).find("field 'ranks' is 4294967296; allowed: -2147483648..2147483647"), std::string::npos)
      << read_error(dir);
}

TEST(RunDirCorruption, AnUnknownHeaderFieldInAKnownVersionIsAnError) {
  auto dir = write_run(fresh_dir());
  replace_in(dir / "phases_rank_1.jsonl", "\"device\":", "\"colour\":\"red\",\"device\":");
  EXPECT_NE(read_error(dir).find("phases_rank_1.jsonl:1: unknown field 'colour' in a version 1.2 header"),
            std::string::npos)
      << read_error(dir);
  dir = write_run(fresh_dir("_run"));
  replace_in(dir / "run.json", "\"device\":", "\"colour\": 1, \"device\":");
  EXPECT_NE(read_error(dir).find("run.json: unknown field 'colour' in a version 1.2 header"), std::string::npos)
      << read_error(dir);
  // Also in a 1.1 file, as the format promised.
  dir = as_version(write_run(fresh_dir("_11")), "1.1");
  EXPECT_EQ(read_error(dir), "");
  replace_in(dir / "phases_rank_0.jsonl", "\"device\":", "\"colour\":\"red\",\"device\":");
  EXPECT_NE(read_error(dir).find("unknown field 'colour' in a version 1.1 header"), std::string::npos)
      << read_error(dir);
}

TEST(RunDirCorruption, ADuplicateKeyIsAnErrorNotTheLastValue) {
  auto dir = write_run(fresh_dir());
  replace_in(dir / "run.json", "\"world_size\": 4", "\"world_size\": 4, \"world_size\": 2");
  EXPECT_NE(read_error(dir).find("run.json: duplicate key \"world_size\" in one JSON object"), std::string::npos)
      << read_error(dir);
  dir = write_run(fresh_dir("_line"));
  replace_in(dir / "phases_rank_0.jsonl", "\"seed\":42", "\"seed\":42,\"seed\":43");
  EXPECT_NE(read_error(dir).find("phases_rank_0.jsonl:1: duplicate key \"seed\""), std::string::npos)
      << read_error(dir);
  dir = write_run(fresh_dir("_phase"));
  replace_in(dir / "phases_rank_0.jsonl", "\"bytes\":1500000000,", "\"bytes\":1500000000,\"bytes\":1,");
  EXPECT_NE(read_error(dir).find("field 'bytes' appears twice"), std::string::npos) << read_error(dir);
}

TEST(RunDirMixed, FilesOfAnotherRunAreRefused) {
  const auto a = write_run(fresh_dir("_a"));
  const auto b = write_run(fresh_dir("_b"));
  auto dir = write_run(fresh_dir());
  fs::copy_file(b / "phases_rank_1.jsonl", dir / "phases_rank_1.jsonl", fs::copy_options::overwrite_existing);
  EXPECT_NE(read_error(dir).find("phases_rank_1.jsonl:1: this file belongs to another run than run.json: run_id"),
            std::string::npos)
      << read_error(dir);
  // summary.json of another run, and of another scenario.
  dir = fresh_dir("_summary");
  {
    RunDirWriter w(dir, header(4), every_step(4, {0, 1}));
    fill(w, 1);
    w.close();
    w.write_summary(minimal_summary(w.header()));
    EXPECT_EQ(read_error(dir), "");
    OrderedJson other = minimal_summary(RunDirReader::read(a).header);
    w.write_summary(other);
    EXPECT_NE(read_error(dir).find("summary.json: belongs to another run than run.json: run_id"), std::string::npos)
        << read_error(dir);
    other = minimal_summary(w.header());
    other["scenario"]["hash"] = "fedcba9876543210";
    w.write_summary(other);
    EXPECT_NE(
        read_error(dir).find("summary.json: belongs to another run than run.json: scenario hash \"fedcba9876543210\""),
        std::string::npos)
        << read_error(dir);
    other = minimal_summary(w.header());
    other["world_size"] = 8;
    w.write_summary(other);
    EXPECT_NE(read_error(dir).find("world_size 8 differs from run.json's 4"), std::string::npos) << read_error(dir);
  }
  // Files without a run id (schema 1.1) are told apart by their scenario.
  dir = as_version(write_run(fresh_dir("_11")), "1.1");
  const auto other = as_version(write_run(fresh_dir("_11b")), "1.1");
  replace_in(other / "phases_rank_1.jsonl", "\"hash\":\"0123456789abcdef\"", "\"hash\":\"0000000000000000\"");
  fs::copy_file(other / "phases_rank_1.jsonl", dir / "phases_rank_1.jsonl", fs::copy_options::overwrite_existing);
  EXPECT_NE(read_error(dir).find("scenario hash \"0000000000000000\" differs from run.json's"), std::string::npos)
      << read_error(dir);
}

TEST(RunDirCorruption, MissingOrNegativeSummaryValuesAreErrors) {
  auto dir = fresh_dir();
  RunDirWriter w(dir, header(4), every_step(4, {0}));
  fill(w, 1);
  w.close();
  OrderedJson s = minimal_summary(w.header());
  s["memory"]["classes"][0]["peak_bytes"] = -1.0;
  w.write_summary(s);
  EXPECT_NE(read_error(dir).find("summary.json: field 'memory.classes[0].peak_bytes' is -1.0; allowed: >= 0"),
            std::string::npos)
      << read_error(dir);
  s = minimal_summary(w.header());
  s.erase("memory");
  w.write_summary(s);
  EXPECT_NE(read_error(dir).find("summary.json: missing field 'memory'"), std::string::npos) << read_error(dir);
}
