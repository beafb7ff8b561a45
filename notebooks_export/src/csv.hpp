#pragma once
// CSV writing shared by the csv and notebook exporters. Internal.
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "threewalls/profiler/run_dir.hpp"

namespace threewalls::notebooks_export::detail {

// Appends one RFC 4180 field (quoted only when needed).
void append_csv_field(std::string& out, std::string_view s);
// runs.csv, phases.csv, steps.csv, walls.csv into `dir` (created).
void write_csv_files(const std::vector<const profiler::RunData*>& runs, const std::filesystem::path& dir, bool force);

}  // namespace threewalls::notebooks_export::detail
