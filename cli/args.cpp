#include "args.hpp"

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <sstream>

#include <unistd.h>

namespace threewalls::cli {

std::string run_dir_size_warning(const std::string& dir, std::uintmax_t limit_bytes) {
  std::error_code ec;
  std::uintmax_t bytes = 0;
  std::size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    if (!e.is_regular_file(ec)) continue;
    const auto n = e.file_size(ec);
    if (ec) continue;
    bytes += n;
    ++files;
  }
  if (bytes <= limit_bytes) return {};
  std::ostringstream os;
  os.precision(3);
  os << "the run directory holds " << static_cast<double>(bytes) / static_cast<double>(1ULL << 30) << " GiB in "
     << files << " files; to record less: run.profiler.ranks = \"representatives\" (one rank per rank class), "
     << "run.profiler.record_every_n_steps, end_step or granularity = \"coarse\"";
  return os.str();
}

void add_overwrite_flag(CLI::App* sub, bool& flag, const std::string& help) {
  sub->add_flag("--overwrite", flag, help);
  const std::string name = sub->get_name();
  sub->add_flag_callback(
         "--force",
         [&flag, name] {
           std::cerr << "threewalls " << name << ": --force is deprecated; use --overwrite (same meaning)\n";
           flag = true;
         },
         "Deprecated alias of --overwrite")
      ->group("");  // hidden from --help
}

const char* const kProfilePathHelp =
    "a relative path is taken from the working directory (a scenario's own [calibration] profile is "
    "relative to the scenario's folder)";

std::string profile_arg_from_cwd(const std::string& spec) {
  if (spec.empty() || spec == "auto") return spec;
  const std::filesystem::path p(spec);
  if (p.is_absolute()) return spec;
  return (std::filesystem::current_path() / p).lexically_normal().string();
}

bool ProgressArg::on() const {
  if (quiet || mode == "never") return false;
  if (mode == "always") return true;
  return isatty(STDERR_FILENO) != 0;
}

void add_progress_option(CLI::App* sub, ProgressArg& p) {
  sub->add_option("--progress", p.mode,
                  "Progress on stderr: auto (only when stderr is a terminal; the default), always, never")
      ->check(CLI::IsMember({"auto", "always", "never"}));
  sub->add_flag("--quiet", p.quiet, "Same as --progress never");
}

std::string error_line(std::string_view sub, std::string_view what) {
  std::string prefix = std::string(sub) + ": ";
  if (what.substr(0, prefix.size()) == prefix) what.remove_prefix(prefix.size());
  return "threewalls " + std::string(sub) + ": " + std::string(what);
}

namespace {

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

}  // namespace

std::string unknown_command_message(std::string_view given, const std::vector<std::string>& commands) {
  std::string best;
  std::size_t best_d = std::max<std::size_t>(2, given.size() / 3) + 1;  // accept distance < this
  for (const auto& c : commands) {
    const bool prefix = !given.empty() && c.rfind(given, 0) == 0;
    const std::size_t d = prefix ? 0 : edit_distance(given, c);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  std::string msg = "unknown command '" + std::string(given) + "'";
  msg += best.empty() ? ";" : "; did you mean '" + best + "'?";
  msg += " commands:";
  for (std::size_t i = 0; i < commands.size(); ++i) msg += (i ? ", " : " ") + commands[i];
  return msg;
}

}  // namespace threewalls::cli
