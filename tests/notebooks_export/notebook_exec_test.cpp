// Executes the exported notebook headless, as a user would open it: `jupyter nbconvert --to notebook
// --execute`. Needs the Debian packages jupyter-nbconvert, python3-pandas, python3-matplotlib and
// python3-ipykernel; without them this test fails and says so (CI installs them).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>

#include "../support/shell.hpp"
#include "test_util.hpp"
#include "threewalls/notebooks_export/export.hpp"

using namespace threewalls;
using namespace threewalls::notebooks_export;
using threewalls::notebooks_export::testing::fresh_dir;
using threewalls::notebooks_export::testing::synthetic;
namespace fs = std::filesystem;

namespace {

// Runs a shell command; returns its exit status and puts stdout+stderr into `output`.
int run(const std::string& cmd, std::string& output) { return threewalls::test::run_shell(cmd + " 2>&1", output); }

}  // namespace

TEST(Notebook, ExecutesHeadlessAndDrawsItsFigures) {
  std::string out;
  const std::string missing =
      "jupyter nbconvert with pandas and matplotlib is needed to execute the exported notebook; install the Debian "
      "packages jupyter-nbconvert python3-pandas python3-matplotlib python3-ipykernel";
  ASSERT_EQ(run("command -v jupyter", out), 0) << missing;
  ASSERT_EQ(run("/usr/bin/env python3 -c 'import sys' && jupyter nbconvert --version", out), 0) << missing << "\n" << out;

  SyntheticSpec s;
  s.ranks = 4;
  s.steps = 3;
  s.layers = 2;
  s.microbatches = 2;
  s.slow_rank = 1;
  s.slow_factor = 1.5;
  profiler::RunData sim = synthetic(s, "_sim");
  s.source = "real";
  s.noise = 0.05;
  s.time_scale = 1.1;
  profiler::RunData real = synthetic(s, "_real");
  const fs::path dir = fresh_dir();
  write_notebook({&sim, &real}, dir / "report.ipynb");

  const std::string cmd = "cd '" + dir.string() + "' && JUPYTER_RUNTIME_DIR='" + (dir / "runtime").string() +
                          "' timeout 600 jupyter nbconvert --to notebook --execute --ExecutePreprocessor.timeout=300 "
                          "report.ipynb --output executed.ipynb";
  ASSERT_EQ(run(cmd, out), 0) << missing << "\n" << cmd << "\n" << out;
  Json nb = read_json_file(dir / "executed.ipynb");
  std::size_t images = 0;
  std::size_t code_cells = 0;
  std::string text;
  for (const auto& c : nb["cells"]) {
    if (c["cell_type"] != "code") continue;
    ++code_cells;
    EXPECT_FALSE(c["execution_count"].is_null()) << "a code cell did not run";
    for (const auto& o : c["outputs"]) {
      EXPECT_NE(o["output_type"], "error") << o.dump();
      if (o.contains("data") && o["data"].contains("image/png")) ++images;
      if (o.contains("text")) {
        for (const auto& l : o["text"]) text += l.get<std::string>();
      }
    }
  }
  EXPECT_EQ(code_cells, 6U);
  // Walls per step, phase breakdown, run-vs-run scatter, per-rank heatmap, timeline.
  EXPECT_EQ(images, 5U);
  EXPECT_NE(text.find("matched records; median error +"), std::string::npos) << text;
}
