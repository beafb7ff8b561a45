#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace threewalls {

// Edit distance (insertions, deletions, substitutions, adjacent transpositions).
std::size_t edit_distance(std::string_view a, std::string_view b);

// The candidate closest to `word` when it is close enough to be a plausible typo
// (distance <= max(2, |word|/3)), else nullopt. Ties go to the first candidate.
std::optional<std::string> nearest(std::string_view word, const std::vector<std::string>& candidates);

// "a, b, c" (with optional quoting of each element).
std::string join(const std::vector<std::string>& items, std::string_view sep = ", ", bool quote = false);

// A string as a TOML/JSON-style quoted literal ("a\"b").
std::string quoted(std::string_view s);

}  // namespace threewalls
