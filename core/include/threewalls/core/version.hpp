#pragma once
// Version constants. Format versions are frozen once written: a reader refuses a major version it
// does not know, by name. Tool version and git sha come from the build.
#include <string_view>

namespace threewalls {

std::string_view tool_version();  // "0.1.0"
std::string_view git_sha();       // 12 hex digits or "unknown"

// Scenario files: `schema_version = 1` at the top of every scenario.
inline constexpr int kScenarioSchemaVersion = 1;

// Run directories (header record of every phases_rank_<r>.jsonl, run.json, summary.json).
inline constexpr std::string_view kRunDirSchemaName = "threewalls.run_dir";
inline constexpr int kRunDirSchemaMajor = 1;
inline constexpr int kRunDirSchemaMinor = 2;  // 1.1: phase field launch_wait_us; 1.2: run_id, step_end

// Calibration profiles ([profile] format_version = "1.0").
inline constexpr std::string_view kProfileFormatName = "threewalls.calibration_profile";
inline constexpr int kProfileFormatMajor = 1;
inline constexpr int kProfileFormatMinor = 0;

}  // namespace threewalls
