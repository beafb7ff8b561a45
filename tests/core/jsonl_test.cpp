#include "threewalls/core/jsonl.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "threewalls/core/error.hpp"

using namespace threewalls;

TEST(Jsonl, RoundTripAndCorruptLineNamesFileAndLine) {
  auto dir = std::filesystem::temp_directory_path() / "tw_jsonl_test";
  std::filesystem::create_directories(dir);
  auto path = dir / "a.jsonl";
  {
    JsonlWriter w(path);
    w.write(Json{{"a", 1}});
    w.write(Json{{"a", 2}});
  }
  int n = 0;
  read_jsonl(path, [&](Json&& j, std::size_t) { n += j["a"].get<int>(); });
  EXPECT_EQ(n, 3);
  {
    std::ofstream out(path, std::ios::app);
    out << "{\"a\": 3";  // truncated line 3
  }
  try {
    read_jsonl(path, [](Json&&, std::size_t) {});
    FAIL() << "no exception";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("a.jsonl:3"), std::string::npos) << e.what();
  }
}

TEST(Jsonl, NumbersAreNeverNan) {
  std::string s;
  append_json_number(s, std::nan(""));
  EXPECT_EQ(s, "null");
  s.clear();
  append_json_number(s, 12.0);
  EXPECT_EQ(s, "12");
}
