#pragma once
// Errors by layer: libraries throw these typed exceptions; only main() turns them into exit codes.
// Every message starts with where the problem is ("file:line:col: ..." or "rank 3: ...").
#include <stdexcept>
#include <string>

namespace threewalls {

// A position in an input file. line/column are 1-based; 0 means "unknown".
struct SourceLocation {
  std::string file;
  int line = 0;
  int column = 0;

  // "file:line:col", "file:line" or "file" depending on what is known.
  [[nodiscard]] std::string str() const;
};

// Base of every threewalls error.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The user's input is wrong (scenario, profile, run directory, command line). Exit code 2.
class InputError : public Error {
 public:
  InputError(const SourceLocation& where, const std::string& what);
  explicit InputError(const std::string& what) : Error(what) {}
  [[nodiscard]] const SourceLocation& where() const { return where_; }

 private:
  SourceLocation where_;
};

// The environment failed us (I/O, missing device, library error). Exit code 3.
class SystemError : public Error {
 public:
  using Error::Error;
};

// Exit codes shared by every subcommand.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;      // the command ran and its verdict is negative (e.g. --fail-above)
inline constexpr int kExitInputError = 2;   // bad input
inline constexpr int kExitSystemError = 3;  // environment / device failure

}  // namespace threewalls
