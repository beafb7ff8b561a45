#include "threewalls/core/error.hpp"

namespace threewalls {

std::string SourceLocation::str() const {
  std::string s = file.empty() ? std::string("<input>") : file;
  if (line > 0) {
    // Appended piecewise: GCC 12 warns (-Wrestrict, a false positive) on `s += ":" + to_string(n)`.
    s.push_back(':');
    s.append(std::to_string(line));
    if (column > 0) {
      s.push_back(':');
      s.append(std::to_string(column));
    }
  }
  return s;
}

InputError::InputError(const SourceLocation& where, const std::string& what)
    : Error(where.str() + ": " + what), where_(where) {}

}  // namespace threewalls
