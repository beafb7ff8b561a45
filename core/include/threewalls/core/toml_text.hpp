// Text of TOML values that more than one writer emits (scenarios, calibration profiles).
#pragma once

#include <string>
#include <string_view>

namespace threewalls {

// A TOML basic string: "..." with quote, backslash, \n, \t, \r, the other control characters and DEL
// escaped. Implemented beside append_json_string (jsonl.cpp), which quotes the same way for JSON.
std::string toml_basic_string(std::string_view s);

}  // namespace threewalls
