// A Jupyter notebook (nbformat 4.5) that loads the exported CSVs with pandas and draws with matplotlib.
// The notebook is plain JSON written here; its Python is kept in the raw strings below.
#include <filesystem>

#include "csv.hpp"
#include "output.hpp"
#include "threewalls/core/error.hpp"
#include "threewalls/notebooks_export/export.hpp"

namespace threewalls::notebooks_export {

namespace {

constexpr const char* kSetup = R"PY(
import pandas as pd
import matplotlib
import matplotlib.pyplot as plt
from matplotlib.patches import Patch

if not DATA.exists():  # the notebook was moved: look next to it
    DATA = Path(DATA_NAME)
runs = pd.read_csv(DATA / "runs.csv")
# Text columns as text, also where a chunk of a large file has none (group).
phases = pd.read_csv(DATA / "phases.csv", dtype={"phase": str, "stream": str, "wall": str, "group": str,
                                                 "coarse": str})
steps = pd.read_csv(DATA / "steps.csv")
walls = pd.read_csv(DATA / "walls.csv")

WALLS = ["compute", "memory", "communication", "host", "bubble"]
WALL_COLORS = {"compute": "#4C72B0", "memory": "#DD8452", "communication": "#55A868",
               "host": "#C44E52", "bubble": "#8172B3"}
label = {int(r.run): f"run {int(r.run)} {r.source}:{r.scenario}" for r in runs.itertuples()}
print(f"{len(phases)} phase records and {len(steps)} step records from {len(runs)} run(s)")
runs
)PY";

constexpr const char* kWalls = R"PY(
# Step time of the critical rank split into the five walls (docs/formats/run_dir.md).
n = walls["run"].nunique()
fig, axes = plt.subplots(1, max(n, 1), figsize=(6 * max(n, 1), 4), squeeze=False)
for ax, (run, df) in zip(axes[0], walls.groupby("run")):
    df = df.dropna(subset=[w + "_us" for w in WALLS])
    x = df["step"].astype(str)
    bottom = pd.Series(0.0, index=df.index)
    for w in WALLS:
        ax.bar(x, df[w + "_us"] / 1e3, bottom=bottom / 1e3, color=WALL_COLORS[w], label=w)
        bottom = bottom + df[w + "_us"]
    ax.set_title(label[run])
    ax.set_xlabel("step")
    ax.set_ylabel("ms")
axes[0][0].legend(loc="lower right")
plt.tight_layout()
plt.show()
)PY";

constexpr const char* kPhases = R"PY(
# Time per phase, per rank and recorded step, coloured by wall (20 largest phases). Posted receives
# (posted_receive = 1, e.g. pp_recv_fwd) wait for their peer most of their duration: they are
# waits, not phase time, and are left out of the ranking.
n = phases["run"].nunique()
fig, axes = plt.subplots(1, max(n, 1), figsize=(7 * max(n, 1), 6), squeeze=False)
for ax, (run, df) in zip(axes[0], phases.groupby("run")):
    per_rank_step = df["step"].nunique() * df["rank"].nunique()
    waits = df[df["posted_receive"] == 1]["dur_us"].sum() / 1e3 / per_rank_step
    df = df[df["posted_receive"] == 0]
    per = df.groupby(["phase", "wall"])["dur_us"].sum().reset_index()
    per["ms"] = per["dur_us"] / 1e3 / per_rank_step
    per = per.sort_values("ms").tail(20)
    ax.barh(per["phase"], per["ms"], color=[WALL_COLORS[w] for w in per["wall"]])
    ax.set_title(label[run] + (f"\n(posted receives, waits: {waits:.1f} ms, not ranked)" if waits > 0 else ""))
    ax.set_xlabel("ms per rank and step")
fig.legend(handles=[Patch(color=WALL_COLORS[w], label=w) for w in WALLS], loc="lower right")
plt.tight_layout()
plt.show()
)PY";

constexpr const char* kScatter = R"PY(
# Record by record: run 1 against run 0 (e.g. measured against simulated), matched by key.
KEY = ["step", "rank", "phase", "layer", "microbatch", "expert"]
if phases["run"].nunique() >= 2:
    a = phases[phases["run"] == 0]
    b = phases[phases["run"] == 1]
    m = a.merge(b, on=KEY, suffixes=("_a", "_b"))
    m = m[(m["dur_us_a"] > 0) & (m["dur_us_b"] > 0)]
    fig, ax = plt.subplots(figsize=(6, 6))
    for w, g in m.groupby("wall_a"):
        ax.scatter(g["dur_us_a"], g["dur_us_b"], s=8, alpha=0.5, color=WALL_COLORS[w], label=w)
    lo = min(m["dur_us_a"].min(), m["dur_us_b"].min())
    hi = max(m["dur_us_a"].max(), m["dur_us_b"].max())
    ax.plot([lo, hi], [lo, hi], "k--", lw=1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(label[0] + "  dur (us)")
    ax.set_ylabel(label[1] + "  dur (us)")
    ax.legend()
    plt.show()
    err = (m["dur_us_b"] - m["dur_us_a"]) / m["dur_us_a"]
    print(f"{len(m)} matched records; median error {100 * err.median():+.1f}%, "
          f"p95 |error| {100 * err.abs().quantile(0.95):.1f}%")
else:
    print("one run: export two runs (a simulated and a measured one) to compare them record by record")
)PY";

constexpr const char* kHeatmap = R"PY(
# Median duration per rank and phase (run 0, 20 largest phases): a slow rank is a bright row.
df = phases[phases["run"] == phases["run"].min()]
top = df[df["posted_receive"] == 0].groupby("phase")["dur_us"].sum().sort_values(ascending=False).head(20).index
piv = df[df["phase"].isin(top)].groupby(["rank", "phase"])["dur_us"].median().unstack(fill_value=0)[top]
fig, ax = plt.subplots(figsize=(12, min(20, max(3, 0.3 * len(piv)))))
im = ax.imshow(piv.values, aspect="auto", cmap="viridis", interpolation="nearest")
ax.set_xticks(range(len(top)))
ax.set_xticklabels(top, rotation=60, ha="right")
every = max(1, len(piv.index) // 32)
ax.set_yticks(range(0, len(piv.index), every))
ax.set_yticklabels(piv.index[::every])
ax.set_ylabel("rank")
fig.colorbar(im, ax=ax, label="median dur (us)")
plt.tight_layout()
plt.show()
)PY";

constexpr const char* kTimeline = R"PY(
# Timeline of the first recorded step of run 0, up to 8 ranks, one lane per rank and stream.
df = phases[phases["run"] == phases["run"].min()]
sel = df[df["step"] == df["step"].min()]
shown = sorted(sel["rank"].unique())[:8]
sel = sel[sel["rank"].isin(shown)]
lanes = sel[["rank", "stream"]].drop_duplicates().sort_values(["rank", "stream"]).reset_index(drop=True)
fig, ax = plt.subplots(figsize=(14, max(3, 0.35 * len(lanes))))
for i, lane in enumerate(lanes.itertuples()):
    g = sel[(sel["rank"] == lane.rank) & (sel["stream"] == lane.stream)]
    ax.broken_barh(list(zip(g["start_us"] / 1e3, g["dur_us"] / 1e3)), (i - 0.4, 0.8),
                   facecolors=[WALL_COLORS[w] for w in g["wall"]])
ax.set_yticks(range(len(lanes)))
ax.set_yticklabels([f"rank {l.rank} {l.stream}" for l in lanes.itertuples()])
ax.invert_yaxis()
ax.set_xlabel("ms since the step started on that rank")
ax.legend(handles=[Patch(color=WALL_COLORS[w], label=w) for w in WALLS], loc="upper right")
plt.tight_layout()
plt.show()
)PY";

OrderedJson source_lines(const std::string& text) {
  OrderedJson lines = OrderedJson::array();
  std::size_t pos = 0;
  while (pos < text.size()) {
    auto nl = text.find('\n', pos);
    if (nl == std::string::npos) {
      lines.push_back(text.substr(pos));
      break;
    }
    lines.push_back(text.substr(pos, nl - pos + 1));
    pos = nl + 1;
  }
  if (!lines.empty()) {  // no trailing newline on the last line, as Jupyter writes it
    std::string last = lines.back().get<std::string>();
    if (!last.empty() && last.back() == '\n') lines.back() = last.substr(0, last.size() - 1);
  }
  return lines;
}

std::string trim_leading_newline(const char* s) { return s[0] == '\n' ? std::string(s + 1) : std::string(s); }

OrderedJson cell(const char* type, const std::string& text, int id) {
  OrderedJson c = OrderedJson::object();
  c["cell_type"] = type;
  c["id"] = "tw-" + std::to_string(id);
  c["metadata"] = OrderedJson::object();
  c["source"] = source_lines(text);
  if (std::string(type) == "code") {
    c["execution_count"] = nullptr;
    c["outputs"] = OrderedJson::array();
  }
  return c;
}

std::string py_str(const std::string& s) {
  std::string out;
  append_json_string(out, s);  // a JSON string literal is a valid Python string literal
  return out;
}

}  // namespace

void write_notebook(const std::vector<const profiler::RunData*>& runs, const std::filesystem::path& out,
                    const ExportOptions& options) {
  if (runs.empty()) throw InputError("export: no run directory given");
  if (out.extension() != ".ipynb") {
    throw InputError(out.string() + ": a notebook's file name ends in .ipynb");
  }
  detail::check_output(out, options.force);
  const std::filesystem::path data = out.parent_path() / (out.stem().string() + "_data");
  detail::write_csv_files(runs, data, options.force);

  std::string title = "# threewalls: " + runs.front()->header.scenario.name + "\n\n";
  title += "Generated by `threewalls export --format notebook`. Runs:\n\n";
  for (std::size_t i = 0; i < runs.size(); ++i) {
    title += "* run " + std::to_string(i) + ": `" + runs[i]->dir.string() + "` (" + runs[i]->header.source + ", " +
             runs[i]->header.device + ", world size " + std::to_string(runs[i]->header.world_size) + ")\n";
  }
  title += "\nThe data are the CSVs of `threewalls export --format csv` (docs/compare_analyze_export.md).";

  std::error_code ec;
  std::string paths = "# Generated by `threewalls export --format notebook`. Edit DATA if the data moved.\n";
  paths += "from pathlib import Path\n\nRUNS = [  # (index, label, run directory)\n";
  for (std::size_t i = 0; i < runs.size(); ++i) {
    auto dir = std::filesystem::absolute(runs[i]->dir, ec);
    paths += "    (" + std::to_string(i) + ", " + py_str(runs[i]->label()) + ", " + py_str(dir.string()) + "),\n";
  }
  paths += "]\nDATA = Path(" + py_str(std::filesystem::absolute(data, ec).string()) + ")\n";
  paths += "DATA_NAME = " + py_str(data.filename().string()) + "\n";
  paths += trim_leading_newline(kSetup);

  OrderedJson cells = OrderedJson::array();
  int id = 0;
  cells.push_back(cell("markdown", title, id++));
  cells.push_back(cell("code", paths, id++));
  cells.push_back(cell("markdown", "## Walls per step\n\nThe critical rank's step time split by precedence: "
                                   "compute > memory > communication > host > bubble.", id++));
  cells.push_back(cell("code", trim_leading_newline(kWalls), id++));
  cells.push_back(cell("markdown", "## Phase breakdown", id++));
  cells.push_back(cell("code", trim_leading_newline(kPhases), id++));
  cells.push_back(cell("markdown", "## Run against run (simulated vs measured)", id++));
  cells.push_back(cell("code", trim_leading_newline(kScatter), id++));
  cells.push_back(cell("markdown", "## Per-rank heatmap", id++));
  cells.push_back(cell("code", trim_leading_newline(kHeatmap), id++));
  cells.push_back(cell("markdown", "## Timeline", id++));
  cells.push_back(cell("code", trim_leading_newline(kTimeline), id++));

  OrderedJson nb = OrderedJson::object();
  nb["cells"] = std::move(cells);
  nb["metadata"] = OrderedJson{
      {"kernelspec", {{"display_name", "Python 3"}, {"language", "python"}, {"name", "python3"}}},
      {"language_info", {{"name", "python"}}},
      {"threewalls", {{"runs", [&] {
                         OrderedJson a = OrderedJson::array();
                         for (const auto* r : runs) a.push_back(r->dir.string());
                         return a;
                       }()}}}};
  nb["nbformat"] = 4;
  nb["nbformat_minor"] = 5;
  detail::OutFile f(out, options.force);
  f.buf() = nb.dump(1);
  f.buf() += '\n';
  f.close();
}

}  // namespace threewalls::notebooks_export
