// profiler/examples/host_loop.cpp is documentation that must keep working: run it, read what it wrote.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>

#include "test_util.hpp"
#include "threewalls/profiler/run_dir.hpp"

using namespace threewalls::profiler;

TEST(HostLoopExample, WritesARunDirectoryTheReaderAccepts) {
  const auto dir = threewalls::profiler::testing::fresh_dir();
  const std::string cmd = std::string(THREEWALLS_BINARY_DIR) + "/profiler/threewalls_host_loop_example '" +
                          dir.string() + "' 12 > /dev/null 2>&1";
  const int status = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << cmd;
  RunData d = RunDirReader::read(dir);
  EXPECT_EQ(d.header.source, "real");
  EXPECT_EQ(d.steps.size(), 3U);   // steps 0, 5, 10: record_every_n_steps = 5
  EXPECT_EQ(d.phases.size(), 9U);  // three phases per recorded step
  ASSERT_TRUE(d.summary.has_value());
  EXPECT_EQ((*d.summary)["steps"].size(), 3U);
  EXPECT_GT((*d.summary)["steps"][0]["walls_us"]["compute"].get<double>(), 0.0);
}
