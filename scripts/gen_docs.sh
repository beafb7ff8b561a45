#!/usr/bin/env bash
# Regenerates the scenario-language references from the built CLI:
#   docs/scenario_reference.md  <- threewalls describe --markdown        (scenarios/src/registry.cpp)
#   docs/scenario_rules.md      <- threewalls describe --rules-markdown  (scenarios/src/validate.cpp)
# tests/scenarios/reference_test.cpp (ReferenceDocs.UpToDate) fails until these match the code.
#
#   scripts/gen_docs.sh [BUILD_DIR]     (default: build; THREEWALLS_BIN=/path/to/threewalls overrides)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$root/build}"
bin="${THREEWALLS_BIN:-$build/cli/threewalls}"
if [[ ! -x "$bin" ]]; then
  echo "gen_docs.sh: no threewalls binary at $bin; build it first:" >&2
  echo "  cmake -S $root -B $build && cmake --build $build --target threewalls" >&2
  exit 2
fi

# Write through temporary files so a failing command never leaves a truncated reference behind.
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$bin" describe --markdown >"$tmp/reference.md"
"$bin" describe --rules-markdown >"$tmp/rules.md"
mv "$tmp/reference.md" "$root/docs/scenario_reference.md"
mv "$tmp/rules.md" "$root/docs/scenario_rules.md"
echo "wrote docs/scenario_reference.md and docs/scenario_rules.md from $bin"
