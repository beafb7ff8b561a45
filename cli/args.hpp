#pragma once
// Argument conventions shared by every subcommand: one flag name per meaning, command-line paths
// relative to the working directory, progress on stderr, and the error line main() prints.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>

namespace threewalls::cli {

// `--overwrite`: replace existing outputs. `--force`, the older name some subcommands used, is kept as a
// hidden alias that still sets `flag` and says on stderr that it is deprecated.
void add_overwrite_flag(CLI::App* sub, bool& flag, const std::string& help);

// A calibration profile named on the command line: "auto" and "" are kept; a relative path is made
// absolute against the working directory (a scenario's own [calibration] profile stays relative to the
// scenario's folder; that is resolved later, by the library).
std::string profile_arg_from_cwd(const std::string& spec);
extern const char* const kProfilePathHelp;  // the sentence --help gives for the rule above

// A warning for a run directory past `limit_bytes` (sum of its files' sizes; 1 GiB for sim and run),
// which says how much it holds and which keys record less; empty at or below. Rule work-size refuses
// a scenario whose run directory would pass 8 GiB before anything runs.
std::string run_dir_size_warning(const std::string& dir, std::uintmax_t limit_bytes = 1ULL << 30);

// `--progress auto|always|never` (auto: only when stderr is a terminal). `--quiet` stays as "never".
struct ProgressArg {
  std::string mode = "auto";
  bool quiet = false;
  [[nodiscard]] bool on() const;
};
void add_progress_option(CLI::App* sub, ProgressArg& p);

// The error line for a subcommand's exception: "threewalls SUB: MESSAGE", without a doubled "SUB: "
// when the message already starts with it.
std::string error_line(std::string_view sub, std::string_view what);

// For an unknown subcommand: "unknown command 'X'; did you mean 'Y'? commands: a, b, ..." (the
// suggestion only when a command is within a small edit distance or starts with X).
std::string unknown_command_message(std::string_view given, const std::vector<std::string>& commands);

}  // namespace threewalls::cli
