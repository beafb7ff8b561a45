#!/usr/bin/env bash
# Builds the scenario-loader libFuzzer target (clang, ASan + UBSan) and runs it, single process.
#
#   scripts/fuzz_loader.sh [SECONDS] [extra libFuzzer flags...]     (default 60 s)
#
# Seeds: scenarios/examples and tests/scenarios/broken (read-only); new inputs go to
# $BUILD/fuzz-corpus, crash/timeout reproducers to $BUILD/fuzz-artifacts/. Reproduce one with
#   $BUILD/tests/scenarios/fuzz/scenario_loader_fuzz $BUILD/fuzz-artifacts/crash-<sha1>
# BUILD defaults to build-fuzz in the repository root (THREEWALLS_FUZZ_BUILD overrides it).
# The machine this was written for has 2 shared cores: the build uses -j2 and the run one process.
set -euo pipefail

seconds="${1:-60}"
shift || true
case "$seconds" in
  ''|*[!0-9]*) echo "usage: $0 [SECONDS] [libFuzzer flags...] (SECONDS must be a whole number)" >&2; exit 2 ;;
esac

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${THREEWALLS_FUZZ_BUILD:-$root/build-fuzz}"

cmake -S "$root" -B "$build" -DTHREEWALLS_FUZZ=ON -DTHREEWALLS_CUDA=OFF -DTHREEWALLS_TESTS=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ >/dev/null
cmake --build "$build" -j2 --target scenario_loader_fuzz

mkdir -p "$build/fuzz-corpus" "$build/fuzz-artifacts"
cd "$build"  # relative calibration.profile paths in inputs resolve here, not in the source tree
exec "$build/tests/scenarios/fuzz/scenario_loader_fuzz" \
  -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=8192 -print_final_stats=1 \
  -dict="$root/tests/scenarios/fuzz/scenario.dict" -artifact_prefix="$build/fuzz-artifacts/" "$@" \
  "$build/fuzz-corpus" "$root/scenarios/examples" "$root/tests/scenarios/broken"
