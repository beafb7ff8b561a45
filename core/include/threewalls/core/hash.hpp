#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace threewalls {

// 64-bit FNV-1a. Used for scenario and profile identity in output headers (not for security).
std::uint64_t fnv1a64(std::string_view data, std::uint64_t seed = 0xcbf29ce484222325ULL);
// 16 lowercase hex digits.
std::string hex64(std::uint64_t v);

}  // namespace threewalls
