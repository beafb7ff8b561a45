#!/usr/bin/env bash
# Runs clang-tidy (.clang-tidy: naming, and the bug and performance checks the code passes) on the
# C++ sources changed since a base, with the compile commands of a build folder:
#
#   scripts/check_tidy.sh [--build DIR] [--base REV] [FILE...]
#
# DIR defaults to build/ (configured by CMake, which writes compile_commands.json); REV to the base
# of scripts/change_base.sh, as for scripts/check_format.sh. A changed header is checked through
# the .cpp files of its folder that include it. Exit 1 on findings; exit 77 (skipped) with a
# one-line reason without clang-tidy, compile commands or a base. Slow (a full parse per file):
# not a CTest test; run it before landing a change.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
skip() { echo "check_tidy: skipped: $*"; exit 77; }
command -v clang-tidy >/dev/null 2>&1 || skip "clang-tidy is not installed (scripts/install_deps.sh installs it)"
build="build"
base=""
files=()
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build="${2:?--build needs a folder}"; shift 2 ;;
    --base) base="${2:?--base needs a revision}"; shift 2 ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) files+=("$1"); shift ;;
  esac
done
[ -f "$build/compile_commands.json" ] || skip "no $build/compile_commands.json (configure with CMake first, or pass --build)"
if [ ${#files[@]} -eq 0 ]; then
  if [ -z "$base" ]; then
    . "$root/scripts/change_base.sh"
    change_base "$root" || skip "$CHANGE_SKIP"
    base="$CHANGE_BASE"
  fi
  declare -A seen=()
  while IFS= read -r -d '' f; do
    case "$f" in
      *.cpp|*.cu) [ -f "$f" ] && seen["$f"]=1 ;;
      *.hpp|*.h|*.cuh)
        # the sources of the same library folder that include it
        name="$(basename "$f")"
        while IFS= read -r src; do seen["$src"]=1; done < <(grep -rl --include='*.cpp' "[/\"]$name\"" "${f%%/*}" 2>/dev/null | head -3) ;;
    esac
  done < <(git diff -z --name-only --diff-filter=ACMR "$base" -- '*.cpp' '*.hpp' '*.h' '*.cu' '*.cuh')
  files=("${!seen[@]}")
fi
# Only sources the build compiles (CUDA sources are left to nvcc).
todo=()
for f in "${files[@]}"; do
  [[ "$f" == *.cu ]] && continue
  grep -q "\"file\": \"$root/$f\"" "$build/compile_commands.json" && todo+=("$f")
done
fail=0
for f in "${todo[@]}"; do
  # Findings of the configured checks only: clang's own diagnostics of GCC-built code (unknown GCC
  # warning flags, C++20 that clang 14 does not parse) are not this check's business.
  found="$(clang-tidy -p "$build" --quiet --extra-arg=-Wno-unknown-warning-option "$f" 2>/dev/null |
    grep -E '(warning|error):.*\[(readability|bugprone|performance)-')"
  if [ -n "$found" ]; then echo "$found"; fail=1; fi
done
if [ $fail -ne 0 ]; then echo "check_tidy: findings above (.clang-tidy)"; exit 1; fi
echo "check_tidy: ${#todo[@]} sources, no findings"
