#pragma once
// The shipped cluster presets (scenarios/clusters/*.toml), compiled into the library by
// scenarios/CMakeLists.txt so `threewalls import --cluster NAME` works wherever the binary is.
#include <vector>

namespace threewalls::scenarios {

struct ClusterPreset {
  const char* name;  // file name without .toml: "h100-dgx"
  const char* toml;  // the file's text
};

const std::vector<ClusterPreset>& cluster_presets();

}  // namespace threewalls::scenarios
