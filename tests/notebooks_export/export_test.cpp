#include "threewalls/notebooks_export/export.hpp"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <sstream>

#include "test_util.hpp"
#include "threewalls/core/error.hpp"

using namespace threewalls;
using namespace threewalls::notebooks_export;
using threewalls::notebooks_export::testing::fresh_dir;
using threewalls::notebooks_export::testing::slurp;
using threewalls::notebooks_export::testing::synthetic;
namespace fs = std::filesystem;

namespace {

SyntheticSpec spec(const std::string& source, double scale) {
  SyntheticSpec s;
  s.source = source;
  s.ranks = 3;
  s.steps = 2;
  s.layers = 2;
  s.microbatches = 2;
  s.time_scale = scale;
  return s;
}

std::vector<std::string> split(const std::string& line, char sep = ',') {
  std::vector<std::string> out;
  std::string cur;
  bool quoted = false;
  for (std::size_t i = 0; i < line.size(); ++i) {
    char c = line[i];
    if (quoted) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
        cur += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        cur += c;
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == sep) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string l;
  while (std::getline(in, l)) out.push_back(l);
  return out;
}

struct TwoRuns {
  profiler::RunData sim = synthetic(spec("sim", 1.0), "_sim");
  profiler::RunData real = synthetic(spec("real", 1.1), "_real");
  std::vector<const profiler::RunData*> both() const { return {&sim, &real}; }
};

}  // namespace

TEST(Perfetto, FollowsTheTraceEventFormatRules) {
  TwoRuns runs;
  auto out = fresh_dir() / "trace.json";
  write_perfetto(runs.both(), out);
  Json j = read_json_file(out);  // valid JSON (no trailing comma, numbers not NaN)
  ASSERT_TRUE(j.is_object());
  ASSERT_TRUE(j["traceEvents"].is_array());
  std::set<long long> named_pids;
  std::set<std::pair<long long, long long>> named_threads;
  std::set<long long> used_pids;
  std::set<std::pair<long long, long long>> used_threads;
  std::size_t complete = 0;
  for (const auto& e : j["traceEvents"]) {
    ASSERT_TRUE(e.contains("ph") && e["ph"].is_string()) << e.dump();
    ASSERT_TRUE(e.contains("name") && e["name"].is_string()) << e.dump();
    ASSERT_TRUE(e.contains("pid") && e["pid"].is_number_integer()) << e.dump();
    ASSERT_TRUE(e.contains("tid") && e["tid"].is_number_integer()) << e.dump();
    const std::string ph = e["ph"];
    const long long pid = e["pid"];
    const long long tid = e["tid"];
    if (ph == "M") {
      const std::string name = e["name"];
      ASSERT_TRUE(name == "process_name" || name == "thread_name" || name == "process_sort_index" ||
                  name == "thread_sort_index")
          << name;
      ASSERT_TRUE(e["args"].is_object());
      if (name == "process_name") {
        ASSERT_TRUE(e["args"]["name"].is_string());
        named_pids.insert(pid);
      } else if (name == "thread_name") {
        ASSERT_TRUE(e["args"]["name"].is_string());
        named_threads.insert({pid, tid});
      } else {
        ASSERT_TRUE(e["args"]["sort_index"].is_number_integer());
      }
    } else if (ph == "C") {  // the memory counter: numeric args
      ASSERT_TRUE(e.contains("ts") && e["ts"].is_number()) << e.dump();
      ASSERT_TRUE(e["args"].is_object() && !e["args"].empty()) << e.dump();
      for (const auto& [k, v] : e["args"].items()) ASSERT_TRUE(v.is_number()) << e.dump();
    } else if (ph == "s" || ph == "f") {  // flows: an id and a time
      ASSERT_TRUE(e.contains("id") && e["id"].is_number_integer()) << e.dump();
      ASSERT_TRUE(e.contains("ts") && e["ts"].is_number()) << e.dump();
      ASSERT_TRUE(e.contains("cat") && e["cat"].is_string()) << e.dump();
    } else {
      ASSERT_EQ(ph, "X") << e.dump();
      ASSERT_TRUE(e.contains("ts") && e["ts"].is_number()) << e.dump();
      ASSERT_TRUE(e.contains("dur") && e["dur"].is_number()) << e.dump();
      ASSERT_GE(e["dur"].get<double>(), 0.0);
      ASSERT_TRUE(e["args"].is_object());
      ASSERT_TRUE(e["args"]["step"].is_number_integer());
      used_pids.insert(pid);
      used_threads.insert({pid, tid});
      ++complete;
    }
  }
  // One X event per phase record and per step record; every process and thread used is named.
  EXPECT_EQ(complete, runs.sim.phases.size() + runs.sim.steps.size() + runs.real.phases.size() + runs.real.steps.size());
  for (auto p : used_pids) EXPECT_TRUE(named_pids.count(p)) << p;
  for (auto t : used_threads) EXPECT_TRUE(named_threads.count(t)) << t.first << "/" << t.second;
}

TEST(Perfetto, RunsSideBySideWithAPidOffsetAndTheSourceInTheProcessName) {
  TwoRuns runs;
  auto out = fresh_dir() / "trace.json";
  write_perfetto(runs.both(), out);
  Json j = read_json_file(out);
  std::map<long long, std::string> names;
  const Json* first_x = nullptr;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "process_name") names[e["pid"]] = e["args"]["name"];
    if (e["ph"] == "X" && e["cat"] == "compute" && !first_x) first_x = &e;
  }
  ASSERT_EQ(names.size(), 6U);
  EXPECT_EQ(names.at(0), "run 0 sim:synthetic_moe rank 0");
  EXPECT_EQ(names.at(kPidStride + 2), "run 1 real:synthetic_moe rank 2");
  ASSERT_NE(first_x, nullptr);
  // ts = epoch_us + start_us, args with layer / mb / bytes / flops.
  const auto& p = runs.sim.phases[1];  // attn_qkv_fwd, layer 0, mb 0 on rank 0
  EXPECT_EQ((*first_x)["name"], runs.sim.names.phases.name(p.phase));
  EXPECT_NEAR((*first_x)["ts"].get<double>(), runs.sim.steps[0].epoch_us + p.start_us, 1e-3);
  EXPECT_NEAR((*first_x)["dur"].get<double>(), p.dur_us, 1e-3);
  EXPECT_EQ((*first_x)["args"]["layer"], 0);
  EXPECT_EQ((*first_x)["args"]["mb"], 0);
  EXPECT_TRUE((*first_x)["args"]["bytes"].is_number());
  EXPECT_TRUE((*first_x)["args"]["flops"].is_number());
  EXPECT_EQ(j["otherData"]["runs"].size(), 2U);
}

TEST(Csv, OneRowPerRecordWithAHeaderRow) {
  TwoRuns runs;
  auto dir = fresh_dir();
  write_csv(runs.both(), dir);
  auto ph = lines(slurp(dir / "phases.csv"));
  ASSERT_EQ(ph.size(), 1 + runs.sim.phases.size() + runs.real.phases.size());
  auto header = split(ph[0]);
  EXPECT_EQ(header, (std::vector<std::string>{
                        "run",    "step",  "rank",     "phase",  "layer",    "microbatch",     "expert",
                        "stream", "wall",  "start_us", "dur_us", "epoch_us", "bytes",          "flops",
                        "peer",   "group", "group_id", "tokens", "coarse",   "launch_wait_us", "posted_receive"}));
  for (std::size_t i = 1; i < ph.size(); ++i) ASSERT_EQ(split(ph[i]).size(), header.size()) << ph[i];
  // Row 2 is the sim run's second record: every field as in the run directory.
  auto row = split(ph[2]);
  const auto& p = runs.sim.phases[1];
  EXPECT_EQ(row[0], "0");
  EXPECT_EQ(row[3], runs.sim.names.phases.name(p.phase));
  EXPECT_EQ(row[4], std::to_string(p.layer));
  EXPECT_EQ(row[6], "");  // no expert: an empty cell
  EXPECT_EQ(row[8], "compute");
  EXPECT_NEAR(std::stod(row[10]), p.dur_us, 1e-3);
  // The collective rows carry their group; the input copy its coarse view.
  EXPECT_EQ(split(ph[1])[18], "host_to_device");
  EXPECT_EQ(row[18], "none");  // a word in every row: pandas reads the column as text, without a DtypeWarning
  EXPECT_EQ(row[20], "0");     // not a posted receive
  bool ep = false;
  for (std::size_t i = 1; i < ph.size(); ++i) ep |= split(ph[i])[15] == "ep";
  EXPECT_TRUE(ep);
  EXPECT_EQ(lines(slurp(dir / "steps.csv")).size(), 1 + runs.sim.steps.size() + runs.real.steps.size());
  auto walls = lines(slurp(dir / "walls.csv"));
  ASSERT_EQ(walls.size(), 1U + 2U * 2U);  // 2 runs x 2 steps
  auto w = split(walls[1]);
  double sum = 0;
  for (int k = 4; k <= 8; ++k) sum += std::stod(w[static_cast<std::size_t>(k)]);
  EXPECT_NEAR(sum, std::stod(w[3]), 1e-2);  // the five walls add up to the step time
  auto r = lines(slurp(dir / "runs.csv"));
  ASSERT_EQ(r.size(), 3U);
  EXPECT_EQ(split(r[2])[1], "real");
  // memory.csv: the simulation's rank classes (the model's breakdown), the real run's measured peaks.
  auto mem = lines(slurp(dir / "memory.csv"));
  ASSERT_GE(mem.size(), 3U);
  const auto mh = split(mem[0]);
  EXPECT_EQ(std::vector<std::string>(mh.begin(), mh.begin() + 9),
            (std::vector<std::string>{"run", "kind", "class", "label", "ranks", "rank", "peak_bytes",
                                      "gpu_memory_bytes", "oom"}));
  bool model = false;
  bool measured = false;
  for (std::size_t i = 1; i < mem.size(); ++i) {
    const auto m = split(mem[i]);
    ASSERT_EQ(m.size(), mh.size()) << mem[i];
    model |= m[0] == "0" && m[1] == "model" && std::stod(m[6]) > 0;
    measured |= m[0] == "1" && m[1] == "measured" && std::stod(m[6]) > 0;
  }
  EXPECT_TRUE(model);
  EXPECT_TRUE(measured);
}

TEST(Csv, FieldsWithCommasOrQuotesAreQuoted) {
  profiler::RunData run = synthetic(spec("sim", 1.0), "");
  run.names.phases = profiler::StringTable();
  for (int i = 0; i < 20; ++i) run.names.phases.intern(i == 0 ? "odd, \"name\"" : "p" + std::to_string(i));
  auto dir = fresh_dir("_out");
  write_csv({&run}, dir);
  auto ph = lines(slurp(dir / "phases.csv"));
  EXPECT_NE(ph[1].find(",\"odd, \"\"name\"\"\","), std::string::npos) << ph[1];
  EXPECT_EQ(split(ph[1])[3], "odd, \"name\"");
}

TEST(Export, ExistingOutputsAreNotOverwrittenWithoutForce) {
  TwoRuns runs;
  auto dir = fresh_dir();
  write_html(runs.both(), dir / "r.html");
  try {
    write_html(runs.both(), dir / "r.html");
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("r.html: exists; outputs are never overwritten (pass --overwrite"),
              std::string::npos);
  }
  ExportOptions force;
  force.force = true;
  EXPECT_NO_THROW(write_html(runs.both(), dir / "r.html", force));
  EXPECT_THROW(parse_export_format("pdf"), InputError);
  EXPECT_EQ(parse_export_format("notebook"), ExportFormat::notebook);
}

TEST(Html, IsSelfContainedWithItsChartsAndFindings) {
  auto s = spec("sim", 1.0);
  s.ranks = 4;
  s.slow_rank = 2;
  s.slow_factor = 2;
  s.slow_phase = "attn_core_fwd";
  profiler::RunData slow = synthetic(s, "_slow");
  profiler::RunData real = synthetic(spec("real", 1.1), "_real");
  auto out = fresh_dir() / "report.html";
  write_html({&slow, &real}, out);
  std::string html = slurp(out);
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0U);
  EXPECT_NE(html.find("</html>"), std::string::npos);
  // Nothing fetched from anywhere: no scripts, no links, no external resources.
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("src="), std::string::npos);
  EXPECT_EQ(html.find("href="), std::string::npos);
  EXPECT_EQ(html.find("url("), std::string::npos);
  EXPECT_EQ(html.find("@import"), std::string::npos);
  std::string without_ns = html;
  for (std::size_t p; (p = without_ns.find("xmlns=\"http://www.w3.org/2000/svg\"")) != std::string::npos;) {
    without_ns.erase(p, 34);
  }
  EXPECT_EQ(without_ns.find("http"), std::string::npos);
  // Step time, walls, phase breakdown, per-rank bars and heatmap for each run, and the comparison.
  std::size_t svgs = 0;
  for (std::size_t p = 0; (p = html.find("<svg", p)) != std::string::npos; ++p) ++svgs;
  EXPECT_GE(svgs, 2U * 5U + 2U);
  for (const char* title :
       {"Step time (critical rank)", "Walls per step (critical rank)", "Phase breakdown (15 largest",
        "Per rank: mean own time + wait", "Per rank and step: own time vs peers", "run 1 against run 0"}) {
    EXPECT_NE(html.find(title), std::string::npos) << title;
  }
  EXPECT_NE(html.find("rank 2 is slow"), std::string::npos);
  EXPECT_NE(html.find("mostly in attn_core_fwd"), std::string::npos);
  EXPECT_NE(html.find("<h3>memory</h3>"), std::string::npos);
  EXPECT_NE(html.find("Median error of the 15 largest phases"), std::string::npos);
}

// One recorded step: that step's walls as bars instead of a line through one point and one column.
TEST(Html, OneRecordedStepShowsItsWallsAsBars) {
  auto s = spec("sim", 1.0);
  s.steps = 1;
  profiler::RunData one = synthetic(s, "_one");
  auto out = fresh_dir() / "report.html";
  write_html({&one}, out);
  const std::string html = slurp(out);
  EXPECT_NE(html.find("Walls of step 0 (critical rank; step time"), std::string::npos);
  EXPECT_EQ(html.find("Step time (critical rank)"), std::string::npos);
  EXPECT_EQ(html.find("Walls per step"), std::string::npos);
}

// Run 1 faster than run 0: the error plot is signed, with negative errors left of a zero line.
TEST(Html, ErrorPlotIsSigned) {
  profiler::RunData a = synthetic(spec("sim", 1.0), "_a");
  profiler::RunData b = synthetic(spec("real", 0.8), "_b");
  auto out = fresh_dir() / "report.html";
  write_html({&a, &b}, out);
  const std::string html = slurp(out);
  const auto at = html.find("Median error of the 15 largest phases");
  ASSERT_NE(at, std::string::npos);
  const std::string plot = html.substr(at, html.find("</svg>", at) - at);
  EXPECT_NE(plot.find(">-20.0<"), std::string::npos) << plot;
  EXPECT_NE(plot.find("stroke=\"#444444\""), std::string::npos) << plot;  // the zero line
}

TEST(Notebook, IsANotebookWithTheRunPathsAndItsData) {
  TwoRuns runs;
  auto dir = fresh_dir();
  write_notebook(runs.both(), dir / "report.ipynb");
  Json nb = read_json_file(dir / "report.ipynb");
  EXPECT_EQ(nb["nbformat"], 4);
  EXPECT_EQ(nb["metadata"]["kernelspec"]["name"], "python3");
  std::string code;
  std::set<std::string> ids;
  for (const auto& c : nb["cells"]) {
    ASSERT_TRUE(c["source"].is_array());
    ids.insert(c["id"].get<std::string>());
    if (c["cell_type"] == "code") {
      EXPECT_TRUE(c["outputs"].empty());
      for (const auto& l : c["source"]) code += l.get<std::string>();
      code += "\n";
    }
  }
  EXPECT_EQ(ids.size(), nb["cells"].size());  // unique cell ids (nbformat 4.5)
  EXPECT_NE(code.find(fs::absolute(runs.sim.dir).string()), std::string::npos);
  EXPECT_NE(code.find(fs::absolute(runs.real.dir).string()), std::string::npos);
  EXPECT_NE(code.find("pd.read_csv(DATA / \"phases.csv\""), std::string::npos);  // with its column dtypes
  for (const char* f : {"runs.csv", "phases.csv", "steps.csv", "walls.csv"}) {
    EXPECT_TRUE(fs::exists(dir / "report_data" / f)) << f;
  }
  EXPECT_THROW(write_notebook(runs.both(), dir / "report.txt"), InputError);
}
