#!/usr/bin/env bash
# Regenerates scenarios/examples/*.golden.json (the stored predictions of the shipped examples) with
# the build in BUILD_DIR (default build-test). Commit the changed files with the change that moved them,
# saying why the prediction moved.
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build-test}"
cmake --build "$build" --target golden_tests threewalls -j"$(nproc)"
THREEWALLS_UPDATE_GOLDENS=1 "$build/tests/cli/golden_tests" --gtest_brief=1
git status --short scenarios/examples/
