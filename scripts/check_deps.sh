#!/usr/bin/env bash
# Checks the library dependency graph of docs/architecture.md on the sources: which threewalls libraries and
# which third-party headers each folder may include. Exit 1 (and a line per violation) otherwise.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
fail=0
# folder: allowed threewalls libraries
declare -A allowed=(
  [core]="core"
  [scenarios]="core scenarios"
  [profiler]="core profiler"
  [records]="core scenarios profiler records"
  [calibration]="core calibration backend scenarios"
  [sim]="core scenarios calibration profiler records sim"
  [backend]="core scenarios profiler records backend"
  [notebooks_export]="core profiler notebooks_export export"
)
for folder in "${!allowed[@]}"; do
  [ -d "$folder" ] || continue
  while IFS= read -r line; do
    file="${line%%:*}"
    lib="$(sed -E 's|.*#include [<"]threewalls/([a-z_]+)/.*|\1|' <<<"$line")"
    ok=0
    for a in ${allowed[$folder]}; do [ "$lib" = "$a" ] && ok=1; done
    # calibration may use backend only from its benchmark driver, and scenarios (the StepGraph ops the
    # driver hands to the backend's OpRunner) only there too
    if [ "$folder" = calibration ] && { [ "$lib" = backend ] || [ "$lib" = scenarios ]; } &&
      [[ "$file" != calibration/bench/* ]]; then ok=0; fi
    if [ $ok -eq 0 ]; then
      echo "dependency violation: $file includes threewalls/$lib (allowed for $folder/: ${allowed[$folder]})"
      fail=1
    fi
  done < <(grep -rnE '#include [<"]threewalls/[a-z_]+/' "$folder" --include='*.hpp' --include='*.cpp' --include='*.cu' --include='*.cuh' || true)
done
# Third-party confinement.
check_only_in() {  # pattern, description, allowed path regex
  local pattern="$1" what="$2" allow="$3"
  while IFS= read -r line; do
    file="${line%%:*}"
    if ! [[ "$file" =~ $allow ]]; then
      echo "dependency violation: $file includes $what (only $allow may)"
      fail=1
    fi
  done < <(grep -rnE "$pattern" core scenarios profiler records calibration sim backend notebooks_export cli \
             --include='*.hpp' --include='*.cpp' --include='*.cu' --include='*.cuh' 2>/dev/null || true)
}
check_only_in '#include [<"]simgrid/' "SimGrid" '^sim/'
check_only_in '#include [<"]toml\+\+/' "toml++" '^(scenarios|calibration)/'
# calibration/tools/*.cu: stand-alone microbenchmarks of the calibration (built with nvcc by hand,
# e.g. timed_op_gap.cu), part of its GPU bench side like calibration/bench/.
check_only_in '#include [<"](cuda_runtime|cuda\.h|cublas|nccl|nvtx3|cuda_bf16|cuda_fp8)' "CUDA/NCCL/NVTX" \
  '^(backend/|profiler/cuda/|profiler/examples/cuda|calibration/bench/|calibration/tools/[^/]*\.cu$|cli/cmd_(run|calibrate))'
# Sub-targets sit above their parent library: the simulator never includes the planner, the scenario
# library never includes the importers.
while IFS= read -r line; do
  echo "dependency violation: $line (sim/planner/ is a sub-target over sim; sim itself may not use it)"
  fail=1
done < <(grep -rnE '#include [<"]threewalls/sim/planner' sim/src sim/include 2>/dev/null || true)
while IFS= read -r line; do
  echo "dependency violation: $line (scenarios/import/ is a sub-target over scenarios; scenarios may not use it)"
  fail=1
done < <(grep -rnE '#include [<"]threewalls/scenarios/import' scenarios/src scenarios/include 2>/dev/null || true)
# sim/ and backend/ never include each other (covered above), and no folder includes cli/.
if [ $fail -eq 0 ]; then echo "check_deps: library graph OK"; fi
exit $fail
