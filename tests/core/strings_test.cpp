#include "threewalls/core/strings.hpp"

#include <gtest/gtest.h>

using namespace threewalls;

TEST(Strings, EditDistanceCountsTranspositionAsOne) {
  EXPECT_EQ(edit_distance("num_experts", "num_expert"), 1U);
  EXPECT_EQ(edit_distance("tp", "pt"), 1U);
  EXPECT_EQ(edit_distance("", "abc"), 3U);
}

TEST(Strings, NearestSuggestsPlausibleTypoOnly) {
  std::vector<std::string> keys = {"num_experts", "num_layers", "hidden_size"};
  EXPECT_EQ(nearest("num_expert", keys).value_or(""), "num_experts");
  EXPECT_EQ(nearest("hiden_size", keys).value_or(""), "hidden_size");
  EXPECT_FALSE(nearest("zzzzzz", keys).has_value());
}
